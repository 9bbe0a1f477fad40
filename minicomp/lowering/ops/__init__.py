"""The lowering table: how each ATen op becomes Triton source inside a fused kernel.

Three kinds of rule, registered by ATen op name (the overload packet, "add"):

* POINTWISE  op -> a Triton expression of its operands at the same index
             (`Op.operand` loads or computes an input, broadcast and cast).
* VIEWS      op -> the index of its one input, given the index of its output:
             a view moves no data, it rewrites the index before the load.
* INDEXED    op -> a value built from inputs at several indexes under masks
             (cat, slice_scatter, constant_pad_nd: Inductor's pointwise_cat; gather;
             a one-hot scatter).

Reductions (sum, mean, amax, ... in reductions.py) are their own kind: the
plan gives them a reduction kernel, which inlines their producers and fuses
the consumers that broadcast their result back.

Anything else is "extern": it runs as an ATen call in the generated wrapper.
Low-precision floats are computed in float32 (see dtypes.py).
"""

from __future__ import annotations

import operator

import torch

from minicomp.ir import Graph, Node, TensorMeta, dtypes
from minicomp.lowering.ops import pointwise, reductions, views  # noqa: F401  (registers the rules)
from minicomp.lowering.ops.core import INDEXED, POINTWISE, SPECIAL_SUPPORT, VIEWS, Op, Value, bind, cast
from minicomp.lowering.ops.reductions import REDUCERS, Reduction

__all__ = ["INDEXED", "POINTWISE", "REDUCERS", "VIEWS", "Op", "Reduction", "Value", "bind", "cast", "classify"]


# -- classification --------------------------------------------------------------


def classify(node: Node, graph: Graph) -> tuple[str, str]:
    """(kind, reason): how `node` lowers, and why when it runs as an ATen call."""
    target = node.target
    if target is operator.getitem:
        return "extern", "getitem of a multi-output op"
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return "extern", f"{target} is not an ATen op"
    name = target._opname
    kind = (
        "pointwise"
        if name in POINTWISE
        else "view"
        if name in VIEWS or name in INDEXED
        else "reduction"
        if name in REDUCERS
        else None
    )
    if kind is None:
        return "extern", f"aten.{name} has no pointwise, view or reduction lowering"
    if not isinstance(node.meta, TensorMeta):
        return "extern", f"aten.{name} returns {node.meta}"
    metas = [node.meta] + [graph[n].meta for n in node.inputs()]
    for meta in metas:
        if not isinstance(meta, TensorMeta):
            return "extern", f"aten.{name} reads a non-tensor value"
        if meta.dtype not in dtypes.SUPPORTED:
            return "extern", f"dtype {meta.dtype} is not supported in kernels"
        if meta.device != node.meta.device:
            return "extern", f"aten.{name} mixes devices"
    if name == "_to_copy" and bind(node).get("device") not in (None, node.meta.device):
        return "extern", "aten._to_copy moves data between devices"
    if name in SPECIAL_SUPPORT and not SPECIAL_SUPPORT[name](node, graph):
        return "extern", f"aten.{name} with these arguments has no in-kernel lowering"
    if kind == "reduction" and (why := reductions.supported(node, graph)):
        return "extern", why
    return kind, ""
