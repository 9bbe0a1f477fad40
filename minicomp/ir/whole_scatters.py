"""A slice_scatter that writes every element of its base is its source.

The gradient of a slice is the slice's gradient scattered into zeros (`slice_backward`:
`slice_scatter(zeros, grad, dim, start, end)`). Where the slice takes its whole dimension
(`h[:, -n:]` with n the whole length: transformers' `logits_to_keep=0`), a static trace records no
slice at all, but a graph whose sizes are symbols keeps it (its bounds are not known to span the
dimension), so each size's graph (capture/specialize.py) wrote zeros and then the gradient over
them: GPT-2's [B * S, 768] hidden gradient a step, a kernel and a buffer.

`whole_scatters` points the readers of such a scatter at its source where the source has the
scatter's shape, strides and dtype (every reader sees the layout it was traced with), and drops the
nodes only the scatter read (the zeros). A scatter that is an output, or that an output views, stays
(the caller gets a tensor of its own).
"""

from __future__ import annotations

from minicomp.ir.cse import pure_op, refs_renamed_in, returned_values
from minicomp.ir.graph import Graph, Ref, TensorMeta


def whole_scatters(graph: Graph) -> Graph:
    """`graph` without its whole-base slice_scatters (a new Graph; `graph` itself when it has none)."""
    kept = returned_values(graph) | {src for _, src in graph.mutations}
    source = {name: src for name in graph.order if name not in kept and (src := _whole_source(graph, name))}
    if not source:
        return graph
    dropped = set(source) | _orphaned(graph, source, kept | set(source.values()))
    nodes = []
    for name in graph.order:
        if name in dropped:
            continue
        node = graph[name]
        if not node.is_input:
            node = refs_renamed_in(node, source)
        nodes.append(node)
    return Graph(nodes, list(graph.outputs), list(graph.mutations), graph.constants, graph.partials, graph.grouped)


def _whole_source(graph: Graph, name: str) -> str | None:
    """The source of `name` where it is a slice_scatter whose source has its meta (shape, strides,
    dtype, device): the slice covers every element of the base. A scatter whose source is another
    such scatter gets that one's source."""
    node = graph[name]
    if node.is_input or node.op_name != "slice_scatter" or len(node.args) < 2 or not isinstance(node.args[1], Ref):
        return None
    src = node.args[1].name
    meta, src_meta = node.meta, graph[src].meta
    if not (isinstance(meta, TensorMeta) and meta == src_meta):
        return None
    return _whole_source(graph, src) or src


def _orphaned(graph: Graph, source: dict[str, str], kept: set[str]) -> set[str]:
    """The pure nodes that only the dropped scatters (and nodes dropped with them) read, but for
    `kept` (outputs, views of them, mutated values and the scatters' sources, read instead)."""
    dropped = set(source)
    for name in reversed(graph.order):
        if name in dropped or name in kept or name in graph.outputs or graph[name].is_input:
            continue
        users = graph.users(name)
        if users and all(u in dropped for u in users) and pure_op(graph[name].target):
            dropped.add(name)
    return dropped - set(source)
