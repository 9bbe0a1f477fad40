"""Values written once where kernels of later stages would recompute them from more bytes
(plan/recompute.py): a pre-norm residual stream, against recomputing a cheap value."""

from __future__ import annotations

import torch
from conftest import check, kernel_count

import minicomp
from minicomp import config
from minicomp.dispatch import saved_layouts
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


def test_a_16_bit_stream_is_written_in_inference_and_not_in_training(device):
    """An inference graph writes a bfloat16 stream as a float32 one (each later norm loads one stream
    value); a training step's graphs write none (a backward recomputes them: the next tests)."""
    args = [a.bfloat16() for a in _args(4, device)]
    check(residual_stream, *args)
    plan = minicomp.jit(residual_stream).compiled(*args).plan
    norms = [k for k in plan.kernels if isinstance(k, ReductionKernel)]
    assert plan.rounded and len(norms[1].loads) == 4 and all(len(k.loads) == 3 for k in norms[2:]), plan
    jitted, args = minicomp.jit(residual_stream), [a.requires_grad_() for a in args]
    jitted(*args).float().sum().backward()
    entry = jitted.entry(*args)
    # rounded in the forward: only the values its backward loads (saved_layouts.saved), none written for its kernels
    assert entry.forward.plan.rounded <= saved_layouts.saved(entry.forward.fx), entry.forward.plan
    assert entry.backward.plan.rounded == frozenset(), entry.backward.plan


def test_a_written_16_bit_value_is_one_value_in_every_kernel(device):
    """v = x + a + b in bfloat16, written for the later norms, is also read as float32 by a kernel
    of its own stage: that kernel rounds it as its store does (the float32 sum, rounded once)."""

    def fn(x, a, b, norm_w, w1, w2):
        v = x + a + b
        h = v + _rms(v, norm_w) @ w1
        h = h + _rms(h, norm_w) @ w2
        return _rms(h, norm_w), v.float() * 1.0

    x, _, norm_w, w1, w2 = (t.bfloat16() for t in _args(2, device))
    args = [x, torch.randn_like(x), torch.randn_like(x), norm_w, w1, w2]
    plan = minicomp.jit(fn).compiled(*args).plan
    assert "add_1" in plan.rounded, plan
    source = check(fn, *args)
    assert "rounded as stored" in source
    x, a, b = (t.float() for t in args[:3])
    assert torch.equal(minicomp.jit(fn)(*args)[1], (x + a + b).bfloat16().float())


def test_a_16_bit_value_is_not_written_for_its_readers():
    """Written, a bfloat16 value is rounded where a backward recomputing it keeps float32: the
    forward's saved amax was taken over the rounded value, the backward's comparison with it over
    the unrounded one, and matched nowhere (NaN gradients; the review of plan/recompute.py)."""

    def fn(a, emb, tok, w):
        h = emb[tok] + a
        h1 = h * 0.9 + (h * h.sum(-1, keepdim=True).flip(1) * 0.1) @ w
        return h1 / h1.abs().amax(-1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    a, emb = torch.randn(2, 4, 8, generator=g).bfloat16(), torch.randn(4, 8, generator=g).bfloat16()
    tok, w = torch.randint(0, 4, (2, 4), generator=g), (torch.randn(8, 8, generator=g) * 0.3).bfloat16()
    args = [a.requires_grad_(), emb.requires_grad_(), tok, w.requires_grad_()]
    minicomp.jit(fn)(*args).float().sum().backward()
    assert all(bool(t.grad.isfinite().all()) for t in (a, emb, w))


def test_a_value_a_template_takes_is_not_written_by_a_kernel_of_its_own():
    """With matmuls as templates, the kernel that would store v (with v * 2) loses v * 2 to the
    first template's operand: v stays inline rather than costing a launch of its own."""

    def fn(x, a, b, c, w1, w2, w3):
        v = x + a + b + c
        h1 = ((v * 2) @ w1) + v
        h2 = (h1 @ w2) + v
        return (h2 @ w3) + v

    args = [torch.randn(16, 16) for _ in range(4)] + [torch.randn(16, 16) * 0.2 for _ in range(3)]
    with config.override(matmul="template"):
        source = check(fn, *args)
        plan = minicomp.jit(fn).compiled(*args).plan
    assert all(set(k.stores) - {"add_2"} for k in plan.kernels), plan
    assert kernel_count(source) == len(plan.kernels)
