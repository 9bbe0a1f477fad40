"""A graph run as Dynamo captured it (the fallback after a failed first call) hands its outputs in
the layouts its trace says: the compiled backward reads the saved ones at those strides, even where
an op's real output is laid out unlike its fake kernel's (guarded_calls.captured)."""

import pytest
import torch

from minicomp.dispatch import dynamo

FAILURES = []  # the calls of `spread` still to fail


@torch.library.custom_op("minicomp_tests::spread", mutates_args=())
def spread(x: torch.Tensor) -> torch.Tensor:
    """x's sum at each of x's positions: one value expanded (stride 0), where the fake kernel says
    a dense tensor."""
    if FAILURES:
        FAILURES.pop()
        raise RuntimeError("a kernel that failed at its first launch")
    return x.sum().expand(x.shape)


@spread.register_fake
def _(x):
    return torch.empty_like(x)


def _spread_backward(ctx, grad):
    return grad.sum().expand(ctx.shape)


def _setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape


spread.register_autograd(_spread_backward, setup_context=_setup)


def fn(x, w):
    return (spread(x) * w).sum()  # w's gradient is the saved spread(x)


@pytest.mark.parametrize("fail", [False, True])
def test_a_saved_output_laid_out_unlike_its_fake_is_read_right(monkeypatch, fail):
    monkeypatch.setenv("MINICOMP_FALLBACK", "silent")  # (the tests' policy raises)
    FAILURES[:] = [1] if fail else []
    x, w = torch.randn(33, requires_grad=True), torch.randn(33, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=dynamo.backend)
    for _ in range(2):
        got = torch.autograd.grad(compiled(x, w), [x, w])
        for g, want in zip(got, torch.autograd.grad(fn(x, w), [x, w])):
            torch.testing.assert_close(g, want)
    assert not FAILURES
    torch._dynamo.reset()


def shared(x):
    y = spread(x)
    return y, y[1:]  # two outputs of one memory


def test_outputs_of_one_memory_still_share_it_after_the_fallback(monkeypatch):
    """Only the values a compiled backward reads are copied into their traced layout: the
    caller's outputs stay as the ops made them (the second a view of the first, as in eager)."""
    monkeypatch.setenv("MINICOMP_FALLBACK", "silent")
    FAILURES[:] = [1]
    x = torch.randn(33)
    torch._dynamo.reset()
    got = torch.compile(shared, backend=dynamo.backend)(x)
    want = shared(x)
    assert not FAILURES
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()
    torch._dynamo.reset()
