"""Through torch.compile, an inference graph's output that views another of its outputs shares
that output's memory, as in eager (dispatch/returned_views.py); the values are eager's."""

import pytest
import torch

from minicomp.dispatch import dynamo


def views_of_a_result(x):
    y = x + 1
    return y, y[1:], y.t(), y.view(-1)[2:5]


def with_a_dtype_view(x):
    y = x + 1
    return y, y[1:], y.view(torch.int32)[1:]  # (no_grad: a dtype view of a result that requires grad
    # fails functionalization's ViewMeta replay in PyTorch itself)


@pytest.mark.parametrize("dynamic", [False, None])
def test_outputs_viewing_another_output_share_its_memory(dynamic):
    torch._dynamo.reset()
    fn = torch.compile(views_of_a_result, backend=dynamo.backend, dynamic=dynamic)
    with torch.no_grad():
        for rows in (4, 5, 7):  # (dynamic=None: Dynamo's automatic dynamic from the second size)
            x = torch.randn(rows, 3)
            got, want = fn(x), views_of_a_result(x)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
                assert g.stride() == w.stride()
                assert g.untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
                assert g.storage_offset() == w.storage_offset()
            got[1][0, 0] = 42.0  # seen through the others, as in eager
            assert got[0][1, 0] == 42.0 and got[2][0, 1] == 42.0
    torch._dynamo.reset()


@pytest.mark.parametrize("grad", [False, True])
def test_jit_outputs_viewing_another_output_share_its_memory(grad):
    """minicomp.jit: an output that views an earlier one is that view of it (capture/outputs.py
    OutputView); with grad AOTAutograd keeps them one memory itself."""
    import minicomp

    fn = minicomp.jit(views_of_a_result)
    x = torch.randn(4, 3, requires_grad=grad)
    for _ in range(2):
        got, want = fn(x), views_of_a_result(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            assert g.untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()


def test_an_output_view_record_survives_the_persistent_cache():
    from torch.utils import _pytree as pytree

    from minicomp.capture.outputs import GraphOutput, Outputs, OutputView

    spec = pytree.tree_flatten((0, 0))[1]
    records = [GraphOutput(0), OutputView(0, 1, (3, 3), (3, 1), 3, (4, 3), (3, 1))]
    again = Outputs.loads(Outputs(spec, records).dumps())
    assert again.records == records
    base = torch.arange(12.0).view(4, 3)
    got = again.assemble([base, base[1:].clone()], [])
    assert got[1].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    got = again.assemble([base.t().contiguous().t(), base[1:].clone()], [])  # laid out otherwise: the copy
    assert got[1].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    torch.testing.assert_close(got[1], base[1:])


@pytest.mark.parametrize("how", ["dynamo", "jit"])
def test_an_output_viewing_another_as_another_dtype_shares_its_memory(how):
    import minicomp

    torch._dynamo.reset()
    fn = (
        torch.compile(with_a_dtype_view, backend=dynamo.backend) if how == "dynamo" else minicomp.jit(with_a_dtype_view)
    )
    with torch.no_grad():
        for rows in (4, 5, 7):
            x = torch.randn(rows, 3)
            got, want = fn(x), with_a_dtype_view(x)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g, w)
                assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
                assert g.untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    torch._dynamo.reset()
