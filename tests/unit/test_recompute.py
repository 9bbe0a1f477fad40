"""Values written once where kernels of later stages would recompute them from more bytes
(plan/recompute.py): a pre-norm residual stream, against recomputing a cheap value."""

from __future__ import annotations

import torch
from conftest import check

import minicomp
from minicomp.plan import recompute
from minicomp.plan.steps import Extern, PointwiseKernel, ReductionKernel


def _rms(h, w):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def residual_stream(x, emb, norm_w, *ws):
    """A pre-norm stack: h_k = h_{k-1} + norm(h_{k-1}) @ W_k, h_0 = x + emb, then a final norm."""
    h = x + emb
    for w in ws:
        h = h + _rms(h, norm_w) @ w
    return _rms(h, norm_w)


def _args(layers: int, device):
    d = 16
    return [torch.randn(4, 6, d, device=device), torch.randn(6, d, device=device), torch.randn(d, device=device)] + [
        torch.randn(d, d, device=device) * 0.2 for _ in range(layers)
    ]


def test_each_norm_of_a_residual_stream_loads_one_stream_value(device):
    """Recomputed, the norm of layer k loaded x, emb and every product before it (k + 3 loads)."""
    args = _args(6, device)
    check(residual_stream, *args)
    plan = minicomp.jit(residual_stream).compiled(*args).plan
    norms = [k for k in plan.kernels if isinstance(k, ReductionKernel)]
    assert len(norms) == 7
    # the stream value before it, the product just made, the norm's weight; the first stream value
    # x + emb (emb broadcast over the batch) is cheaper recomputed in the one norm that reads it
    assert len(norms[1].loads) == 4 and all(len(k.loads) == 3 for k in norms[2:]), plan


def test_a_value_cheap_to_recompute_is_not_written(device):
    """y = exp(x) read by a row sum and, after a matmul, by a later kernel: recomputing it there
    loads x, as many bytes as loading y would, so it is not written."""

    def fn(x, w):
        y = x.exp()
        return y.sum(1), y[:, :4] * (x @ w)

    x, w = torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)
    check(fn, x, w)
    plan = minicomp.jit(fn).compiled(x, w).plan
    assert "exp" not in plan.materialized and sum("exp" in k.nodes for k in plan.kernels) == 2, plan


def test_a_value_behind_a_written_one_is_not_written(device):
    """c = (x + a + b) * 2 is written (each later norm would recompute it from three loads); x + a + b
    is not: every later kernel that computes it loads c instead."""

    def fn(x, a, b, norm_w, w1, w2):
        c = (x + a + b) * 2
        h = c + _rms(c, norm_w) @ w1
        h = h + _rms(h, norm_w) @ w2
        return _rms(h, norm_w)

    x, _, norm_w, w1, w2 = _args(2, device)
    args = [x, torch.randn_like(x), torch.randn_like(x), norm_w, w1, w2]
    check(fn, *args)
    plan = minicomp.jit(fn).compiled(*args).plan
    loaded = {n for k in plan.kernels for n in k.loads}
    loaded |= {i for step in plan.steps if isinstance(step, Extern) for i in plan.graph[step.node].inputs()}
    stored = {n for k in plan.kernels for n in k.stores}
    assert stored - loaded <= {o for o in plan.graph.outputs if isinstance(o, str)}, plan
    assert len(plan.kernels[1].loads) == 3, plan  # c, the product, the norm's weight


def test_a_chosen_value_no_later_kernel_loads_is_unread():
    first = PointwiseKernel(0, 0, (4,), ["a", "b"])
    later = PointwiseKernel(1, 1, (4,), ["c"], nodes=["c"], loads=["b"])
    assert recompute.unread([first, later], {"a": 0, "b": 0, "c": 1}, {"a", "b"}) == {"a"}
