"""A returned view of a tensor the function closes over is that view, as in eager: a write into it
reaches the tensor (capture/outputs.py `ConstantView`), through minicomp.jit's inference and
training signatures."""

import pytest
import torch

import minicomp

W = torch.arange(12.0)


def views(x):
    return x * 2, W[1:], W.view(3, 4).t(), W.view(torch.int32)[2:], W[::3]


@pytest.mark.parametrize("grad", [False, True])
def test_a_returned_view_of_a_closed_over_tensor_writes_through_to_it(grad):
    fn = minicomp.jit(views)
    x = torch.randn(12, requires_grad=grad)
    for _ in range(2):  # the first call and a later one
        got, want = fn(x), views(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride()
        for view, eager in zip(got[1:], want[1:]):
            assert view.untyped_storage().data_ptr() == W.untyped_storage().data_ptr()
            assert view.storage_offset() == eager.storage_offset()
    before = W.clone()
    fn(x)[1][0] = -1.0  # eager writes W[1]
    assert W[1] == -1.0
    W.copy_(before)


def test_a_view_of_an_argument_that_also_reads_a_closed_over_tensor_is_the_arguments():
    """`x.expand_as(W)` views x, not W (a view op views its first tensor argument)."""

    def fn(x):
        return x.expand_as(W.view(3, 4)), x + 1

    x = torch.randn(1, 4)
    got = minicomp.jit(fn)(x)
    assert got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(got[0], fn(x)[0])


def _written_out(x):
    buf = torch.empty(3, 4)[1:]
    torch.mul(W.view(3, 4)[:2], 2, out=buf)  # (its result is buf, no view of W)
    return buf, x + 1


def _broadcast(x):
    return torch.broadcast_tensors(W.view(3, 4), x * 2)[1], x + 1  # (a view of x * 2, not of W)


@pytest.mark.parametrize("fn", [_written_out, _broadcast])
@pytest.mark.parametrize("grad", [False, True])
def test_a_result_of_an_op_on_a_closed_over_tensor_that_views_another_is_no_view_of_it(fn, grad):
    """Only a view op's results view its first tensor argument: an `out=` tensor, or one of
    broadcast_tensors' results for another argument, came back as a view of W (training)."""
    x = torch.randn(4, requires_grad=grad)
    got, want = minicomp.jit(fn)(x), fn(x)
    torch.testing.assert_close(got, want)
    assert got[0].requires_grad == want[0].requires_grad
    assert got[0].untyped_storage().data_ptr() != W.untyped_storage().data_ptr()
