"""Golden generated modules for canonical graphs: emission is deterministic and reviewed.

Regenerate after an intended change with MINICOMP_UPDATE_GOLDEN=1 and read the diff.
"""
import os
from pathlib import Path

import pytest
import torch

import minicomp
import workloads as w

GOLDEN = Path(__file__).parent / "golden"


def mlp(x, wt, b):
    return torch.sigmoid(torch.relu(x * 2.0 + 1.0) @ wt + b)


CASES = {
    "bias_gelu": (w.gelu_tanh, lambda: (torch.randn(8, 64), torch.randn(64))),
    "rope": (w.rope, lambda: (torch.randn(2, 4, 16, 64), torch.randn(2, 4, 16, 64), torch.randn(16, 64), torch.randn(16, 64))),
    "mlp_with_matmul": (mlp, lambda: (torch.randn(8, 16), torch.randn(16, 32), torch.randn(32))),
}


@pytest.mark.parametrize("name", CASES)
def test_generated_source_matches_golden(name):
    fn, make = CASES[name]
    source = minicomp.jit(fn).source(*make())
    again = minicomp.jit(fn).source(*make())
    assert source == again  # same graph, same text
    path = GOLDEN / f"{name}.py"
    if os.environ.get("MINICOMP_UPDATE_GOLDEN"):
        path.write_text(source)
    assert source == path.read_text(), f"generated source changed: diff against {path}"
