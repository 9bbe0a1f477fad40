"""Writes into temporaries, made functional: the in-place ops a decomposition leaves in a graph
(`t.add_(eps)`, `copy_` into slices of an `empty`) become out-of-place ops, or the graph is
traced once more through functionalization where a write lands in a view.
"""

from __future__ import annotations

import operator

import torch
import torch.fx


def functional_temporaries(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`t.add_(eps)` on a temporary nothing else reads becomes `add(t, eps)`: decompositions
    (rms_norm's) write in place on values they just made, which functionalization never sees."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        packet = target._opname
        if not packet.endswith("_") or packet.startswith("_") or not node.args:
            continue
        first = node.args[0]
        if not isinstance(first, torch.fx.Node) or not _fresh(first) or len(first.users) != 1:
            continue  # a view's write lands in its base (circular pad's copy_ into slices of an empty)
        functional = getattr(getattr(torch.ops.aten, packet[:-1], None), target._overloadname, None)
        if functional is not None:
            node.target = functional
    gm.recompile()
    return gm


def _fresh(node: torch.fx.Node) -> bool:
    """Whether an op node's result is memory of its own: not a view of another value, nor the
    result of an in-place op (which is its first argument)."""
    if node.op != "call_function":
        return False
    target, index = node.target, 0
    if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):  # one result of a tuple
        target, index = node.args[0].target, node.args[1]
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    if not returns or isinstance(index, int) and index >= len(returns):
        return len(returns) == 1 and returns[0].alias_info is None  # a Tensor[] result
    return returns[index].alias_info is None


def writes_in_place(gm: torch.fx.GraphModule) -> bool:
    """Whether an op of the graph still writes in place, besides the final `copy_` of a mutated
    input into it: a decomposition that writes into a view of a value it made (circular pad
    fills slices of an `empty`), which make_fx's decompositions run below functionalization."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.target._schema.is_mutable:
            continue
        first = node.args[0] if node.args else None
        if (
            node.target is torch.ops.aten.copy_.default
            and isinstance(first, torch.fx.Node)
            and first.op == "placeholder"
        ):
            continue
        return True
    return False


def functionalized(gm: torch.fx.GraphModule, tensors: list[torch.Tensor], table: dict) -> torch.fx.GraphModule:
    """`gm` traced once more through functionalization, with the decomposition `table`: a write
    into a view of a temporary becomes a pure op (slice_scatter, ...) whose value later reads
    see; a mutated input keeps its final `copy_`."""
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        traced = make_fx(
            functionalize(gm, remove="mutations"),
            decomposition_table=table,
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*[t.detach() for t in tensors])
    return functional_temporaries(traced)
