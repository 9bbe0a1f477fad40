"""A slice_scatter that writes every element of its base is its source (ir/whole_scatters.py):
its readers read the source, the zeros it was written over are gone; one over part of its base,
of another layout than its source, or handed to the caller stays. Results against eager."""

from __future__ import annotations

import pytest
import torch
from conftest import graph_of, ops_of

import minicomp
from minicomp.ir.whole_scatters import whole_scatters


def whole(g):  # the gradient of x[:, -6:] over a dim of 6: zeros, the gradient written over them
    return torch.slice_scatter(torch.zeros(4, 6), g.sin(), 1, -6) * 2


def chained(g):  # two whole scatters, one into the other
    inner = torch.slice_scatter(torch.zeros(4, 6), g.sin(), 0, 0, 4)
    return torch.slice_scatter(torch.zeros(4, 6), inner, 1, 0) + 1


@pytest.mark.parametrize("fn", [whole, chained])
def test_a_whole_scatter_reads_as_its_source(fn):
    g = torch.randn(4, 6)
    traced = graph_of(fn, g)
    assert "slice_scatter" in ops_of(traced)
    graph = whole_scatters(traced)
    assert "slice_scatter" not in ops_of(graph) and "full" not in ops_of(graph)
    torch.testing.assert_close(minicomp.jit(fn)(g), fn(g))


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda g: torch.slice_scatter(torch.zeros(4, 6), g.sin(), 1, 0, 3) * 2, (4, 3)),  # part of the base
        (lambda g: torch.slice_scatter(torch.zeros(4, 6), g.sin().t(), 1) * 2, (6, 4)),  # the source transposed
        (lambda g: torch.slice_scatter(torch.zeros(4, 6), g.sin(), 1), (4, 6)),  # an output: the caller's own
    ],
)
def test_other_scatters_stay(fn, shape):
    g = torch.randn(*shape)
    graph = graph_of(fn, g)
    assert "slice_scatter" in ops_of(graph) and whole_scatters(graph) is graph
    torch.testing.assert_close(minicomp.jit(fn)(g), fn(g))
