"""Common subexpressions: an op computed twice on the same arguments is computed once.

Traced models repeat work that eager runs twice: transformers builds a layer's attention mask
from the same boolean mask in every layer (`where(mask, 0.0, -inf)`, its `scalar_tensor`s), a
decomposition recomputes `x - mean` for the variance and the normalization. `common_subexpressions`
keeps the first of each group of nodes with the same op and the same arguments (after the earlier
merges: a chain of repeats folds whole) and points the others' readers at it, as AOTAutograd's
`fx_graph_cse` does for a joint graph (which minicomp's inference and `minicomp.jit` graphs
never pass through).

A node is merged only where that cannot change what a caller sees:
- its op is a pure ATen op (no mutable argument, no side effect, not random: a
  `nondeterministic_seeded` op draws new values each time; not `empty`, whose contents are
  undefined) or the getitem of a merged node;
- no graph output is it or a view of it (two outputs that eager returns as separate tensors stay
  separate), and no input's new value is it;
- no op between the two writes in place (a graph that does forgets what it has seen there);
- its arguments compare equal by type as well as by value (`full(1)` is int64, `full(1.0)`
  float, `full(-0.0)` not `full(0.0)`), and its result has the same metadata.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import torch

from minicomp.ir.graph import Graph, Ref

_UNDEFINED = frozenset(("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"))


def common_subexpressions(graph: Graph) -> Graph:
    """`graph` with each repeated computation made once (a new Graph; `graph` itself when none is)."""
    kept_apart = returned_values(graph) | {src for _, src in graph.mutations}
    first: dict[tuple, str] = {}  # key -> the node that computes it
    merged: dict[str, str] = {}  # a repeat -> the node its readers read instead
    nodes = []
    for name in graph.order:
        node = graph[name]
        if not node.is_input and merged:
            node = refs_renamed_in(node, merged)
        if _writes(node.target):  # (a graph that still writes in place: what was read before may differ after)
            first.clear()
        key = None if node.is_input or name in kept_apart or not pure_op(node.target) else _key(node)
        if key is not None:
            same = first.get(key)
            if same is not None and graph[same].meta == node.meta:
                merged[name] = same
                continue
            first.setdefault(key, name)
        nodes.append(node)
    if not merged:
        return graph
    return Graph(nodes, list(graph.outputs), list(graph.mutations), graph.constants, graph.partials, graph.grouped)


def returned_values(graph: Graph) -> set[str]:
    """The outputs and every node an output may be a view of (a view op's input, a getitem's)."""
    found: set[str] = set()
    stack = [o for o in graph.outputs if isinstance(o, str)]
    while stack:
        name = stack.pop()
        if name in found:
            continue
        found.add(name)
        node = graph[name]
        if not node.is_input and _aliases(node.target):
            stack.extend(node.inputs())
    return found


def _aliases(target) -> bool:
    """Whether the op's result may share memory with an argument (a view), or is a getitem."""
    if target is operator.getitem:
        return True
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _writes(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def pure_op(target) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if schema.is_mutable or not schema.returns or target._opname in _UNDEFINED:
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._opname.startswith("_assert"):
        return False
    return True


def _key(node) -> tuple | None:
    """(op, arguments) as a hashable value, each constant with its type; None where one is not
    hashable (the node is then never merged)."""
    try:
        key = (node.target, _frozen(node.args), _frozen(node.kwargs))
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value):
    if isinstance(value, Ref):
        return ("ref", value.name)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value, math.copysign(1.0, value))
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("not compared by value")
    return (type(value).__name__, value)


def refs_renamed_in(node, renamed: dict[str, str]):
    """`node` reading, for each value `renamed` names, the one it maps to."""
    return dataclasses.replace(node, args=refs_renamed(node.args, renamed), kwargs=refs_renamed(node.kwargs, renamed))


def refs_renamed(value, merged: dict[str, str]):
    if isinstance(value, Ref):
        return Ref(merged[value.name]) if value.name in merged else value
    if isinstance(value, (list, tuple)):
        return type(value)(refs_renamed(v, merged) for v in value)
    if isinstance(value, dict):
        return {k: refs_renamed(v, merged) for k, v in value.items()}
    return value
