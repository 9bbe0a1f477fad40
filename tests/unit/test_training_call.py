"""Later training calls of a simple signature skip AOTAutograd's runtime (training_call.py):
the same gradients as eager, call after call; anything not simple keeps AOTAutograd's function."""

import pytest
import torch

import minicomp
from minicomp import config
from minicomp.tools.workloads import WORKLOADS, rope

CALLS = 4  # the first compiles, the first backward compiles the backward, the second call decides


def _run(fn, inputs, grads=None, **backward):
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = grads or [torch.ones_like(o) for o in outs]
    torch.autograd.backward(
        [o for o in outs if o.requires_grad], [g for o, g in zip(outs, grads) if o.requires_grad], **backward
    )
    return outs


def _fresh(inputs):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]


def _same_as_eager(fn, make, grads=None):
    """Calls fn through minicomp CALLS times on fresh inputs; outputs and gradients as eager's."""
    jitted = minicomp.jit(fn, fallback="raise")
    for _ in range(CALLS):
        inputs = make()
        eager = _fresh(inputs)
        got, want = _run(jitted, inputs, grads), _run(fn, eager, grads)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
            assert a.requires_grad == b.requires_grad
        for a, b in zip(inputs, eager):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad)
    return jitted.entry(*make())


def test_rope_gqa_calls_run_lean_with_eagers_gradients(device):
    make = lambda: WORKLOADS["rope_gqa_fwbw"].make(3, torch.float32, device)  # noqa: E731
    entry = _same_as_eager(rope, make)
    assert entry.lean is not None


def test_lean_calls_match_aotautograd_and_can_be_turned_off(device):
    make = lambda: WORKLOADS["rope_gptj_fwbw"].make(3, torch.float32, device)  # noqa: E731
    with config.override(lean_training=False):
        assert _same_as_eager(WORKLOADS["rope_gptj_fwbw"].fn, make).lean is None
    assert _same_as_eager(WORKLOADS["rope_gptj_fwbw"].fn, make).lean is not None


def test_a_gradient_laid_out_unlike_its_tangent_is_laid_out_first(device):
    """The outputs are transposed like q; gradients arrive contiguous (as from a later op)."""
    make = lambda: WORKLOADS["rope_gqa_fwbw"].make(3, torch.float32, device)  # noqa: E731
    shapes = [t.shape for t in make()[:2]]
    grads = [torch.randn(s, device=device) for s in shapes]  # contiguous
    assert _same_as_eager(rope, make, grads).lean is not None


def test_outputs_that_need_no_gradient_stay_so(device):
    def fn(x, w, y):
        return x * w, (y * 2).sum(-1)  # the second depends on no input that requires grad

    def make():
        x, w = torch.randn(4, 8, device=device, requires_grad=True), torch.randn(8, device=device, requires_grad=True)
        return [x, w, torch.randn(4, 8, device=device)]

    assert _same_as_eager(fn, make).lean is not None


def test_an_unused_output_gets_zeros(device):
    def fn(x):
        return x.exp(), x.sin()

    def make():
        return [torch.randn(4, 8, device=device, requires_grad=True)]

    jitted = minicomp.jit(fn, fallback="raise")
    for _ in range(CALLS):
        x = make()[0]
        x_eager = x.detach().clone().requires_grad_()
        jitted(x)[1].sum().backward()
        fn(x_eager)[1].sum().backward()
        torch.testing.assert_close(x.grad, x_eager.grad)
    assert jitted.entry(x).lean is not None


def test_retain_graph_backward_twice(device):
    make = lambda: [torch.randn(4, 8, device=device, requires_grad=True)]  # noqa: E731
    jitted = minicomp.jit(lambda x: (x * x.sigmoid()).sum(-1), fallback="raise")
    for _ in range(CALLS):
        x = make()[0]
        x_eager = x.detach().clone().requires_grad_()
        out, out_eager = jitted(x), (x_eager * x_eager.sigmoid()).sum(-1)
        for _ in range(2):
            out.sum().backward(retain_graph=True)
            out_eager.sum().backward(retain_graph=True)
        torch.testing.assert_close(x.grad, x_eager.grad)
    assert jitted.entry(x).lean is not None


def test_double_backward_is_eagers(device):
    """The lean call's backward under create_graph=True runs eager's (differentiable) backward
    (issue #37; tests/guards/test_trust_modes.py has the calls before it)."""

    def fn(x):
        return (x * x.sigmoid()).sum()

    jitted = minicomp.jit(fn, fallback="raise")
    for _ in range(CALLS - 1):
        jitted(torch.randn(8, device=device, requires_grad=True)).backward()
    x = torch.randn(8, device=device, requires_grad=True)
    assert jitted.entry(x).lean is not None
    (g,) = torch.autograd.grad(jitted(x), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    (e,) = torch.autograd.grad(fn(x), x, create_graph=True)
    torch.testing.assert_close(gg, torch.autograd.grad(e.sum(), x)[0])


@pytest.mark.parametrize("case", ["alias", "mutation"])
def test_aliases_and_mutations_keep_aotautograd(device, case):
    def alias(x):
        return x, x * 2

    def mutation(x, buf):
        buf.add_(1)
        return x * buf

    def make():
        x = torch.randn(4, 8, device=device, requires_grad=True)
        return [x] if case == "alias" else [x, torch.zeros(4, 8, device=device)]

    fn = alias if case == "alias" else mutation
    jitted = minicomp.jit(fn, fallback="raise")
    for _ in range(CALLS):
        inputs = make()
        eager = _fresh(inputs)
        got, want = _run(jitted, inputs), _run(fn, eager)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(inputs[0].grad, eager[0].grad)
        if case == "mutation":
            torch.testing.assert_close(inputs[1], eager[1])
    assert jitted.entry(*make()).lean is None


def test_under_autocast_the_graphs_keep_their_own_casts(device):
    """The traced graphs hold autocast's casts; the lean call runs them with autocast off (as
    AOTAutograd does), so an op autocast would run in float32 is not cast again."""

    def fn(x, w):
        return torch.softmax(x @ w, -1) * 2

    jitted = minicomp.jit(fn, fallback="raise")
    for _ in range(CALLS):
        x, w = (
            torch.randn(4, 8, device=device, requires_grad=True),
            torch.randn(8, 8, device=device, requires_grad=True),
        )
        xe, we = _fresh([x, w])
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out, out_eager = jitted(x, w), fn(xe, we)
        assert out.dtype == out_eager.dtype
        out.float().sum().backward()
        out_eager.float().sum().backward()
        torch.testing.assert_close(out, out_eager, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(x.grad, xe.grad, atol=2e-2, rtol=2e-2)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        assert jitted.entry(x, w).lean is not None
