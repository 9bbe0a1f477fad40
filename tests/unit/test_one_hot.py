"""A scatter of one value per row as a select (capture/one_hot.py): eager's values, any dim;
other shapes left to the scatter."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.capture import one_hot


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["src", "value", "add"])
def test_select_equals_scatter(op, dim):
    torch.manual_seed(0)
    self = torch.randn(5, 7)
    shape = [5, 7]
    shape[dim] = 1
    index = torch.randint(0, self.shape[dim], shape)
    src = torch.randn(shape)
    eager = {
        "src": lambda s, i, v: torch.scatter(s, dim, i, v),
        "value": lambda s, i, v: torch.scatter(s, dim, i, 2.5),
        "add": lambda s, i, v: torch.scatter_add(s, dim, i, v),
    }[op]
    gm = make_fx(eager, decomposition_table=one_hot.table())(self, index, src)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("scatter" in str(t) for t in ops), ops
    torch.testing.assert_close(gm(self, index, src), eager(self, index, src))


def test_other_shapes_stay_scatters():
    self, index, src = torch.zeros(5, 7), torch.tensor([[0, 3], [1, 1]]), torch.ones(2, 2)
    fn = lambda s, i, v: torch.scatter_add(s, 1, i, v)  # noqa: E731 - two values a row
    gm = make_fx(fn, decomposition_table=one_hot.table())(self, index, src)
    assert any("scatter_add" in str(n.target) for n in gm.graph.nodes)
    torch.testing.assert_close(gm(self, index, src), fn(self, index, src))
