"""What a dynamic training graph's forward at one size tells its backward at that size
(dispatch/sized_contracts.py): found by the saved values' shapes; two forwards of one set of shapes
that produced otherwise leave no agreement, and a backward compiled on the first one's word runs as
captured from then on. End to end: tests/e2e/test_dynamic_training_contracts.py."""

from __future__ import annotations

import torch
import torch.fx

from minicomp.dispatch.sized_contracts import Contracts, Produced


def _graph(names: list[str], shapes: list[tuple], outputs: bool) -> torch.fx.GraphModule:
    """A forward returning values named `names`, or a backward taking them, of those shapes."""
    graph = torch.fx.Graph()
    if outputs:
        x = graph.placeholder("x")
        x.meta["val"] = torch.empty(shapes[0])
        made = []
        for name, shape in zip(names, shapes):
            node = graph.call_function(torch.clone, (x,))
            node.name = name
            node.meta["val"] = torch.empty(shape)
            made.append(node)
        graph.output(tuple(made))
    else:
        made = []
        for name, shape in zip(names, shapes):
            node = graph.placeholder(name)
            node.meta["val"] = torch.empty(shape)
            made.append(node)
        graph.output(tuple(torch.fx.Proxy(n).sum().node for n in made))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


SAVED = frozenset({"mm", "rsqrt"})


def test_a_backward_finds_the_forward_of_its_saved_shapes():
    contracts = Contracts()
    small = Produced({"mm": ((6, 37), (40, 1))}, frozenset({"mm"}))
    large = Produced({"mm": ((8, 37), (40, 1))}, frozenset({"mm"}))
    contracts.forward_compiled(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], True), SAVED, small)
    contracts.forward_compiled(_graph(["mm", "rsqrt"], [(8, 37), (8, 1)], True), SAVED, large)
    assert contracts.for_backward(_graph(["mm", "rsqrt"], [(8, 37), (8, 1)], False), SAVED)[1] == large
    assert contracts.for_backward(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], False), SAVED)[1] == small
    assert contracts.for_backward(_graph(["mm", "rsqrt"], [(7, 37), (7, 1)], False), SAVED)[1] is None
    assert contracts.for_backward(_graph(["mm_2", "rsqrt"], [(6, 37), (6, 1)], False), SAVED) == (None, None)


def test_two_forwards_that_disagree_leave_their_backward_as_captured():
    contracts = Contracts()
    first = Produced({}, frozenset({"mm", "rsqrt"}))
    contracts.forward_compiled(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], True), SAVED, first)
    key, produced = contracts.for_backward(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], False), SAVED)
    assert produced == first
    calls = []
    run = contracts.relied_on(lambda args: calls.append("compiled"), key, lambda args: calls.append("captured"))
    run([])
    contracts.forward_compiled(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], True), SAVED, first)  # the same word
    run([])
    other = Produced({}, frozenset({"rsqrt"}))  # (its mm is not its own: no backward may write over it)
    contracts.forward_compiled(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], True), SAVED, other)
    run([])
    assert calls == ["compiled", "compiled", "captured"]
    assert contracts.for_backward(_graph(["mm", "rsqrt"], [(6, 37), (6, 1)], False), SAVED)[1] is None
