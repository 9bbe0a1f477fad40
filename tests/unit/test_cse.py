"""Common subexpressions (ir/cse.py): a repeated pure op computed once, and every case where a
merge would change what the caller sees left alone. Graphs traced as minicomp.jit traces them;
each compiled function is also compared with eager."""

from __future__ import annotations

import torch
from conftest import check
from torch.utils import _pytree as pytree

import minicomp
from minicomp import capture, ir
from minicomp.ir.cse import common_subexpressions


def _graph(fn, *args) -> ir.Graph:
    names = [f"a{i}" for i in range(len(args))]
    traced = capture.trace(fn, list(args), pytree.tree_flatten((args, {}))[1], names)
    return ir.from_fx(traced.gm, traced.input_names)


def _ops(graph: ir.Graph) -> list[str]:
    return [graph[n].op_name for n in graph.order if not graph[n].is_input]


def _layer_masks(x, mask):
    """Two layers building the same additive mask from one boolean mask, as transformers does."""
    m1 = torch.where(mask, 0.0, float("-inf"))
    m2 = torch.where(mask, 0.0, float("-inf"))
    h = (x + m1).softmax(-1)
    return (h + m2).softmax(-1)


def test_a_repeated_chain_is_computed_once():
    x, mask = torch.randn(4, 8), torch.rand(4, 8) > 0.3
    graph = _graph(_layer_masks, x, mask)
    merged = common_subexpressions(graph)
    assert _ops(graph).count("where") == 2 and _ops(merged).count("where") == 1
    assert len(merged.order) < len(graph.order)
    check(_layer_masks, x, mask)


def test_nothing_repeated_gives_the_same_graph():
    graph = _graph(lambda x: (x * 2).exp(), torch.randn(4))
    assert common_subexpressions(graph) is graph


def test_random_ops_are_drawn_each_time(device):
    def two_draws(x):
        return torch.rand_like(x) + torch.rand_like(x)

    graph = common_subexpressions(_graph(two_draws, torch.randn(64)))
    assert _ops(graph).count("rand_like") == 2 or _ops(graph).count("rand") == 2


def test_outputs_that_eager_returns_apart_stay_apart():
    """`x * 2` twice, both returned (one through a view): the caller gets two tensors, as from eager."""

    def twice(x):
        return x * 2, (x * 2).view(-1)

    graph = common_subexpressions(_graph(twice, torch.randn(2, 3)))
    assert _ops(graph).count("mul") == 2
    x = torch.randn(2, 3)
    ja, jb = minicomp.jit(twice)(x)
    assert ja.data_ptr() != jb.data_ptr()
    ja.add_(1)
    torch.testing.assert_close(jb, (x * 2).view(-1))


def test_constants_compare_by_type_and_sign():
    """full(1) is int64, full(1.0) float32, full(True) bool; -0.0 is not 0.0 (1 / x tells)."""

    def fills(x):
        a = torch.full((3,), 1) + torch.full((3,), 1.0) + torch.full((3,), True)
        return x / torch.full((3,), 0.0) + x / torch.full((3,), -0.0) + a

    graph = common_subexpressions(_graph(fills, torch.ones(3)))
    assert _ops(graph).count("full") == 5
    check(fills, torch.ones(3))


def test_an_input_written_in_between_is_read_again():
    """`x.mul_(2)` between two reads of `x + 1`: the functional trace reads the new value, and
    the mutation's source is kept apart."""

    def bump(x):
        a = x + 1
        x.mul_(2)
        return a, x + 1

    check(bump, torch.randn(5))
    graph = common_subexpressions(_graph(bump, torch.randn(5)))
    assert _ops(graph).count("add") == 2


def test_repeats_of_a_multi_output_op_and_its_getitems_fold():
    def split_twice(x):
        a, _ = torch.var_mean(x, -1)
        b, _ = torch.var_mean(x, -1)
        return a * b

    graph = _graph(split_twice, torch.randn(4, 6))
    merged = common_subexpressions(graph)
    assert len(merged.order) < len(graph.order)
    check(split_twice, torch.randn(4, 6))
