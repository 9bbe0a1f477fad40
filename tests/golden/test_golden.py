"""Golden generated modules for canonical graphs: emission is deterministic and reviewed.

Regenerate after an intended change with MINICOMP_UPDATE_GOLDEN=1 and read the diff.
"""

import os
from pathlib import Path

import pytest
import torch
import workloads as w

import minicomp
from minicomp.tools.workloads import add_rms_norm, cross_entropy, rms_norm, running_sum

GOLDEN = Path(__file__).parent / "modules"


def cross_entropy_loss(logits, target):
    return (cross_entropy(logits, target),)  # a tuple: generated() sums each output


def mlp(x, wt, b):
    return torch.sigmoid(torch.relu(x * 2.0 + 1.0) @ wt + b)


CASES = {
    "bias_gelu": (w.gelu_tanh, lambda: (torch.randn(8, 64), torch.randn(64))),
    "rope": (
        w.rope,
        lambda: (torch.randn(2, 4, 16, 64), torch.randn(2, 4, 16, 64), torch.randn(16, 64), torch.randn(16, 64)),
    ),
    "rope_training": (
        w.rope,
        lambda: (
            torch.randn(2, 4, 16, 64, requires_grad=True),
            torch.randn(2, 4, 16, 64, requires_grad=True),
            torch.randn(16, 64),
            torch.randn(16, 64),
        ),
    ),  # forward, then backward
    "mlp_with_matmul": (mlp, lambda: (torch.randn(8, 16), torch.randn(16, 32), torch.randn(32))),
    # reduction kernels: persistent (rows of 64), looped with the online max-and-sum (rows of 9000)
    "add_rms_norm": (add_rms_norm, lambda: (torch.randn(8, 64), torch.randn(8, 64), torch.randn(64))),
    "cross_entropy": (cross_entropy, lambda: (torch.randn(4, 9000), torch.randint(0, 9000, (4,)))),
    # training with reductions: the norm's backward in row groups (dx + partial dW, then their sum),
    # cross-entropy's backward one looped kernel with the target's one-hot inside
    "rms_norm_training": (
        rms_norm,
        lambda: (torch.randn(64, 64, requires_grad=True), torch.randn(64, requires_grad=True)),
    ),
    "cross_entropy_training": (
        cross_entropy_loss,
        lambda: (torch.randn(4, 9000, requires_grad=True), torch.randint(0, 9000, (4,))),
    ),
    # a scan kernel walking rows of 9000 a tile at a time, the tiles before carried along
    "running_sum": (running_sum, lambda: (torch.randn(4, 9000).bfloat16(),)),
}


def generated(fn, args) -> str:
    """The module(s) minicomp generates for fn(*args); when training, after one backward
    (AOTAutograd compiles the backward graph on the first backward call)."""
    compiled = minicomp.jit(fn)
    outputs = compiled(*args)
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        sum(o.sum() for o in outputs).backward()
    return compiled.source(*args)


@pytest.mark.parametrize("name", CASES)
def test_generated_source_matches_golden(name):
    fn, make = CASES[name]
    source, again = generated(fn, make()), generated(fn, make())
    assert source == again  # same graph, same text
    path = GOLDEN / f"{name}.py"
    if os.environ.get("MINICOMP_UPDATE_GOLDEN"):
        path.write_text(source)
    assert source == path.read_text(), f"generated source changed: diff against {path}"
