"""Through torch.compile, an inference graph's output that views another of its outputs shares
that output's memory, as in eager (dispatch/returned_views.py); the values are eager's."""

import pytest
import torch

from minicomp.dispatch import dynamo


def views_of_a_result(x):
    y = x + 1
    return y, y[1:], y.t(), y.view(-1)[2:5]


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
