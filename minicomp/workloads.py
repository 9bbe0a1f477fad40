"""The seed workloads: the functions minicomp is measured on and how to make their inputs.

A bottom-layer module (it imports torch only): the demo, `minicomp explain`,
the benchmark and the tests all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def gelu_tanh(x, b):
    y = x + b
    return 0.5 * y * (1 + torch.tanh(0.7978845608 * (y + 0.044715 * y**3)))


def gelu_erf(x, b):
    return F.gelu(x + b)


def bias_relu(x, b):
    return torch.relu(x + b)


def lora_epilogue(x, y, b):
    return torch.relu(x + 0.5 * y + b)


def swiglu(g, u):
    return F.silu(g) * u


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@dataclass
class Workload:
    name: str
    fn: Callable
    make: Callable[[int, torch.dtype, torch.device], list]  # size -> inputs
    sizes: list[int]  # the sweep; the last is the headline size
    backward: bool = False  # time forward + backward


def _matrix(n_inputs: int, with_bias: bool):
    def make(rows: int, dtype, device):
        xs = [torch.randn(rows, 8192, dtype=dtype, device=device) for _ in range(n_inputs)]
        return xs + ([torch.randn(8192, dtype=dtype, device=device)] if with_bias else [])

    return make


def _rope_inputs(requires_grad: bool):
    def make(seq: int, dtype, device):
        q, k = (torch.randn(8, 32, seq, 128, dtype=dtype, device=device, requires_grad=requires_grad) for _ in range(2))
        cos, sin = (torch.randn(seq, 128, dtype=dtype, device=device) for _ in range(2))
        return [q, k, cos, sin]

    return make


ROWS = [512, 2048, 8192]  # x of [rows, 8192]; 8192 rows is the headline [8192, 8192]
SEQS = [128, 512, 2048, 8192]  # q, k of [8, 32, S, 128]

WORKLOADS = {
    w.name: w
    for w in [
        Workload("gelu_tanh", gelu_tanh, _matrix(1, True), ROWS),
        Workload("gelu_erf", gelu_erf, _matrix(1, True), ROWS),
        Workload("bias_relu", bias_relu, _matrix(1, True), ROWS),
        Workload("lora_epilogue", lora_epilogue, _matrix(2, True), ROWS),
        Workload("swiglu", swiglu, _matrix(2, False), ROWS),
        Workload("rope_fw", rope, _rope_inputs(False), SEQS),
        Workload("rope_fwbw", rope, _rope_inputs(True), SEQS, backward=True),
    ]
}
