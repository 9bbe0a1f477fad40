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


def rope_neox_partial(q, k, cos, sin):
    """GPT-NeoX's partial rotary: the first cos.shape[-1] dims of each head rotate (a quarter of
    them in the bench), the rest pass through."""
    r = cos.shape[-1]

    def one(x):
        rot, rest = x[..., :r], x[..., r:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)

    return one(q), one(k)


def rope_gptj(q, k, cos, sin):
    """GPT-J's rotary: interleaved pairs (x0, x1) -> (-x1, x0); cos and sin of [S, D/2], each
    repeated for the two elements of its pair."""
    cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)

    def one(x):
        rotated = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
        return x * cos + rotated * sin

    return one(q), one(k)


def mask_add(scores, mask):  # eager attention's additive mask, broadcast over batch and heads
    return scores + mask


def rms_norm(x, w):  # Hugging Face's LlamaRMSNorm.forward
    h = x.float()
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + 1e-6)
    return w * h.to(x.dtype)


def add_rms_norm(x, r, w):  # the residual add before a norm, returning both
    h = x + r
    return h, rms_norm(h, w)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x):
    return torch.softmax(x, -1)


def cross_entropy(logits, target):
    return F.cross_entropy(logits.float(), target)


def running_sum(probs):  # top-p sampling's running probability mass over a (sorted) vocabulary
    return probs.float().cumsum(-1)


def column_sum(g):  # a bias gradient: sum over the rows (split: few outputs, a long reduced dim)
    return g.sum(0)


def head_sum(g):  # a RoPE cos/sin gradient: summed over batch and heads (rows contiguous in memory)
    return g.sum((0, 1))


def mse_loss(a, b):  # one scalar from all of both inputs (split, then combined)
    return F.mse_loss(a, b)


def llama_block(x, norm1, wq, wk, wv, wo, cos, sin, norm2, w_gate, w_up, w_down):
    """A Llama-style decoder block: RMSNorm, q/k/v projections, RoPE, causal SDPA, output
    projection, residual, RMSNorm, SwiGLU MLP, residual. x: [B, S, D], heads of 128; k and v
    have wk.shape[1] // 128 heads, each serving a group of q heads (GQA: Hugging Face's
    repeat_kv, an expand and a reshape)."""
    batch, seq, dim = x.shape
    heads = dim // 128
    h = rms_norm(x, norm1)
    q, k, v = ((h @ w).view(batch, seq, w.shape[1] // 128, 128).transpose(1, 2) for w in (wq, wk, wv))
    q, k = rope(q, k, cos, sin)
    kv_heads = k.shape[1]
    if kv_heads != heads:
        k, v = (t[:, :, None].expand(batch, kv_heads, heads // kv_heads, seq, 128).reshape(q.shape) for t in (k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + a.transpose(1, 2).reshape(batch, seq, dim) @ wo
    h = rms_norm(x, norm2)
    return x + (F.silu(h @ w_gate) * (h @ w_up)) @ w_down


@dataclass
class Workload:
    name: str
    fn: Callable
    make: Callable[[int, torch.dtype, torch.device], list]  # size -> inputs
    sizes: list[int]  # the sweep; the last is the headline size
    backward: bool = False  # time forward + backward


def _matrix(n_inputs: int, with_bias: bool, grad: bool = False):
    def make(rows: int, dtype, device):
        xs = [torch.randn(rows, 8192, dtype=dtype, device=device, requires_grad=grad) for _ in range(n_inputs)]
        return xs + ([torch.randn(8192, dtype=dtype, device=device, requires_grad=grad)] if with_bias else [])

    return make


def _rope_inputs(requires_grad: bool):
    def make(seq: int, dtype, device):
        q, k = (torch.randn(8, 32, seq, 128, dtype=dtype, device=device, requires_grad=requires_grad) for _ in range(2))
        cos, sin = (torch.randn(seq, 128, dtype=dtype, device=device) for _ in range(2))
        return [q, k, cos, sin]

    return make


def _rope_forms(q_heads: int, k_heads: int, rotary: int, transposed: bool = False, grad: bool = False):
    """q, k of [4, heads, S, 128] (views of [4, S, heads, 128] projections when `transposed`,
    as Llama's q/k are; requiring grad when `grad`), cos and sin of [S, rotary]."""

    def make(seq: int, dtype, device):
        def heads(n):
            if transposed:
                return torch.randn(4, seq, n, 128, dtype=dtype, device=device).transpose(1, 2).requires_grad_(grad)
            return torch.randn(4, n, seq, 128, dtype=dtype, device=device, requires_grad=grad)

        cos, sin = (torch.randn(seq, rotary, dtype=dtype, device=device) for _ in range(2))
        return [heads(q_heads), heads(k_heads), cos, sin]

    return make


def _scores(seq: int, dtype, device):  # attention scores [4, 16, S, S] and a mask [S, S]
    return [torch.randn(4, 16, seq, seq, dtype=dtype, device=device), torch.randn(seq, seq, dtype=dtype, device=device)]


def _rows(n_inputs: int, n_weights: int, width: int = 4096, grad: bool = False):
    def make(rows: int, dtype, device):
        xs = [torch.randn(rows, width, dtype=dtype, device=device, requires_grad=grad) for _ in range(n_inputs)]
        return xs + [torch.randn(width, dtype=dtype, device=device, requires_grad=grad) for _ in range(n_weights)]

    return make


def _heads(seq: int, dtype, device):  # a gradient of [8, 32, S, 128]
    return [torch.randn(8, 32, seq, 128, dtype=dtype, device=device)]


def _logits(vocab: int, grad: bool = False):
    def make(rows: int, dtype, device):
        target = torch.randint(0, vocab, (rows,), device=device)
        return [torch.randn(rows, vocab, dtype=dtype, device=device, requires_grad=grad), target]

    return make


def _block(dim: int = 2048, hidden: int = 5632, batch: int = 4, kv_heads: int | None = None, grad: bool = False):
    kv = (kv_heads or dim // 128) * 128  # the width of the k and v projections

    def make(seq: int, dtype, device):
        def param(*shape, scale=None, shift=0.0):
            t = torch.randn(*shape, dtype=dtype, device=device) * (scale or shape[0] ** -0.5) + shift
            return t.requires_grad_(grad)

        x = param(batch, seq, dim, scale=1.0)
        norms = [param(dim, scale=0.1, shift=1.0) for _ in range(2)]
        cos, sin = (torch.randn(seq, 128, dtype=dtype, device=device) for _ in range(2))
        attention = [param(dim, dim), param(dim, kv), param(dim, kv), param(dim, dim)]
        mlp = [param(dim, hidden), param(dim, hidden), param(hidden, dim)]
        return [x, norms[0], *attention, cos, sin, norms[1], *mlp]

    return make


ROWS = [512, 2048, 8192]  # x of [rows, 8192]; 8192 rows is the headline [8192, 8192]
NORM_ROWS = [2048, 8192, 32768]  # x of [rows, 4096]; the headline is [32768, 4096]
VOCAB_ROWS = [1024, 4096, 8192]  # logits of [rows, 32000]
SEQS = [128, 512, 2048, 8192]  # q, k of [8, 32, S, 128]
ROPE_SEQS = [512, 2048]  # the RoPE forms' q, k of [4, heads, S, 128]

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
        # RoPE as real models lay it out: Llama with GQA (32 q heads, 8 k heads, q/k
        # transposed views of [B, S, H, D]), GPT-NeoX's partial rotary (a quarter of the head
        # dim), GPT-J's interleaved pairs
        Workload("rope_gqa", rope, _rope_forms(32, 8, 128, transposed=True), ROPE_SEQS),
        Workload("rope_neox_partial", rope_neox_partial, _rope_forms(32, 32, 32), ROPE_SEQS),
        Workload("rope_gptj", rope_gptj, _rope_forms(32, 32, 64), ROPE_SEQS),
        Workload("rope_gqa_fwbw", rope, _rope_forms(32, 8, 128, transposed=True, grad=True), ROPE_SEQS, backward=True),
        Workload(
            "rope_neox_partial_fwbw", rope_neox_partial, _rope_forms(32, 32, 32, grad=True), ROPE_SEQS, backward=True
        ),
        Workload("rope_gptj_fwbw", rope_gptj, _rope_forms(32, 32, 64, grad=True), ROPE_SEQS, backward=True),
        # a broadcast input larger than a plane's share of L2 (codegen/plane_order.py)
        Workload("mask_add", mask_add, _scores, [1024, 2048]),
        Workload("rms_norm", rms_norm, _rows(1, 1), NORM_ROWS),
        Workload("add_rms_norm", add_rms_norm, _rows(2, 1), NORM_ROWS),
        Workload("layer_norm", layer_norm, _rows(1, 2), NORM_ROWS),
        Workload("softmax", softmax, _rows(1, 0), NORM_ROWS),
        Workload("cross_entropy", cross_entropy, _logits(32000), VOCAB_ROWS),
        Workload("cross_entropy_128k", cross_entropy, _logits(128256), [1024, 4096]),
        Workload("running_sum", running_sum, _rows(1, 0, width=32000), VOCAB_ROWS),
        Workload("column_sum", column_sum, _rows(1, 0), NORM_ROWS),
        Workload("head_sum", head_sum, _heads, [512, 2048]),
        Workload("mse_loss", mse_loss, _rows(2, 0), NORM_ROWS),
        Workload("llama_block", llama_block, _block(), [512, 2048]),
        # training (forward + backward)
        Workload("rms_norm_fwbw", rms_norm, _rows(1, 1, grad=True), NORM_ROWS, backward=True),
        Workload("layer_norm_fwbw", layer_norm, _rows(1, 2, grad=True), NORM_ROWS, backward=True),
        Workload("softmax_fwbw", softmax, _rows(1, 0, grad=True), NORM_ROWS, backward=True),
        Workload("cross_entropy_fwbw", cross_entropy, _logits(32000, grad=True), VOCAB_ROWS, backward=True),
        # a bias's gradient, the column sum of the pointwise gradient that feeds it
        Workload("bias_gelu_fwbw", gelu_tanh, _matrix(1, True, grad=True), ROWS, backward=True),
        # a decoder block's training step: bf16, B=4, S=2048, d=2048, 16 q heads sharing 4 k/v heads
        Workload("llama_block_fwbw", llama_block, _block(kv_heads=4, grad=True), [512, 2048], backward=True),
    ]
}
