"""Issue #37, class 10: an index out of range raises as in eager, where a kernel reads through it
(gather, cross_entropy's target, a one-hot scatter), by a device-side check in the kernel (CPU).
Each function is compiled on valid indices first, so the bad ones reach the compiled kernel."""

import pytest
import torch
import torch.nn.functional as F

import minicomp
import minicomp.dispatch.dynamo


def _compiled_then_raises(fn, good: tuple, bad: tuple, compiled=None):
    compiled = compiled or minicomp.jit(fn)
    torch.testing.assert_close(compiled(*good), fn(*good))
    with pytest.raises((IndexError, RuntimeError)):
        fn(*bad)
    with pytest.raises((IndexError, RuntimeError)):
        compiled(*bad)
    torch.testing.assert_close(compiled(*good), fn(*good))  # and right again after


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bad_value", [5, -1, 2**32 + 1])
def test_gather_index_out_of_bounds_raises(dtype, bad_value):
    if dtype == torch.int32 and bad_value > 2**31:
        pytest.skip("not an int32")
    x = torch.randn(4, 5)
    good = torch.tensor([[0], [4], [1], [2]], dtype=dtype).long()
    bad = good.clone()
    bad[1, 0] = bad_value
    _compiled_then_raises(lambda x, i: x.gather(1, i) * 2, (x, good), (x, bad))


def test_gather_along_a_transposed_input_raises():
    x = torch.randn(4, 5)
    good = torch.tensor([[0, 1, 4, 3]])
    bad = torch.tensor([[0, 1, 7, 3]])
    _compiled_then_raises(lambda x, i: torch.gather(x.t(), 0, i.t()) + 1, (x, good), (x, bad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad_value", [5, -3, 2**32 + 1])
def test_cross_entropy_target_out_of_bounds_raises(dtype, bad_value):
    x = torch.randn(4, 5).to(dtype)
    good = torch.tensor([0, 4, -100, 2])  # -100: ignore_index, allowed
    bad = good.clone()
    bad[1] = bad_value
    _compiled_then_raises(lambda x, t: F.cross_entropy(x, t), (x, good), (x, bad))


def test_cross_entropy_in_a_looped_row_raises():
    x = torch.randn(3, 5000)
    good, bad = torch.tensor([0, 4999, 7]), torch.tensor([0, 5000, 7])
    _compiled_then_raises(lambda x, t: F.cross_entropy(x, t, reduction="none"), (x, good), (x, bad))


def test_cross_entropy_training_target_out_of_bounds_raises():
    x = torch.randn(4, 5, requires_grad=True)
    good, bad = torch.tensor([0, 4, 1, 2]), torch.tensor([0, 9, 1, 2])
    fn = lambda x, t: F.cross_entropy(x, t)  # noqa: E731
    compiled = minicomp.jit(fn)
    loss = compiled(x, good)
    loss.backward()
    torch.testing.assert_close(loss, fn(x, good))
    with pytest.raises((IndexError, RuntimeError)):
        compiled(x, bad).backward()


def test_one_hot_scatter_out_of_bounds_raises():
    good, bad = torch.tensor([[0], [2], [4]]), torch.tensor([[0], [5], [4]])
    _compiled_then_raises(lambda i: torch.zeros(3, 5).scatter(1, i, 1.0) * 2, (good,), (bad,))


def test_gather_out_of_bounds_raises_through_the_backend():
    x = torch.randn(4, 5)
    good = torch.tensor([[0], [4], [1], [2]])
    bad = torch.tensor([[0], [4], [6], [2]])
    fn = lambda x, i: x.gather(1, i) * 2  # noqa: E731
    _compiled_then_raises(fn, (x, good), (x, bad), compiled=torch.compile(fn, backend=minicomp.dispatch.dynamo.backend))


def test_indexing_and_embedding_raise_through_aten():
    x = torch.randn(4, 5)
    _compiled_then_raises(lambda x, i: x[i] + 1, (x, torch.tensor([0, 3])), (x, torch.tensor([0, 2**32 + 1])))
    _compiled_then_raises(lambda w, i: F.embedding(i, w) + 1, (x, torch.tensor([0, 3])), (x, torch.tensor([0, 4])))
