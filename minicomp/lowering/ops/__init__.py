"""The lowering table: how each ATen op becomes Triton source inside a fused kernel.

Three tables of rules, by ATen op name (the overload packet, "add"):

* POINTWISE  op -> a Triton expression of its operands at the same index
             (`Op.operand` loads or computes an input, broadcast and cast).
* VIEWS      op -> the index of its one input, given the index of its output:
             a view moves no data, it rewrites the index before the load.
* INDEXED    op -> a value built from inputs at several indexes under masks
             (cat, slice_scatter, constant_pad_nd: Inductor's pointwise_cat; gather;
             a one-hot scatter).

Reductions (sum, mean, amax, ... in reductions.py) are their own `NodeKind`: the
plan gives them a reduction kernel, which inlines their producers and fuses
the consumers that broadcast their result back. Scatter-accumulates (index_put with
accumulate, scatter_add: scatters.py) are another: a kernel of atomic adds each, and scans
(cumsum, cumprod, logcumsumexp: scans.py) a third: a kernel each, combining along one dim.

Anything else is an extern: it runs as an ATen call in the generated wrapper.
`classify` says which (`NodeKind`).
Low-precision floats are computed in float32 (see dtypes.py).
"""

from __future__ import annotations

import operator
from enum import Enum

import torch

from minicomp.ir import Graph, Node, TensorMeta, dtypes
from minicomp.lowering.ops import indexed, pointwise, reductions, scans, scatters, views  # noqa: F401  (registers the rules)
from minicomp.lowering.ops.core import INDEXED, POINTWISE, SPECIAL_SUPPORT, VIEWS, Op, Value, bind, bitcast, cast
from minicomp.lowering.ops.reductions import REDUCERS, Reduction

__all__ = [
    "INDEXED",
    "POINTWISE",
    "REDUCERS",
    "VIEWS",
    "NodeKind",
    "Op",
    "Reduction",
    "Value",
    "bind",
    "bitcast",
    "cast",
    "classify",
]


# -- classification --------------------------------------------------------------


class NodeKind(Enum):
    """How a node lowers. Prints as its word ("pointwise"), as the IR's and the plan's text show it."""

    INPUT = "input"  # a graph input: read from memory
    POINTWISE = "pointwise"  # an expression of its operands at the same index, inside any kernel
    VIEW = "view"  # an index rewrite (or a masked gather) before a load, inside any kernel
    REDUCTION = "reduction"  # computed by a reduction kernel
    SCATTER = "scatter"  # computed by a scatter kernel (atomic adds at indexes a tensor holds)
    SCAN = "scan"  # computed by a scan kernel (a running sum, product or logaddexp along one dim)
    EXTERN = "extern"  # an ATen call in the generated wrapper

    def __str__(self) -> str:
        return self.value

    @property
    def fusible(self) -> bool:
        """Can a node of this kind be computed inside any kernel?"""
        return self in (NodeKind.POINTWISE, NodeKind.VIEW)

    @property
    def computed(self) -> bool:
        """Is a node of this kind computed by a kernel (fusible nodes, reductions and scatters)?"""
        return self in (NodeKind.POINTWISE, NodeKind.VIEW, NodeKind.REDUCTION, NodeKind.SCATTER, NodeKind.SCAN)

    @property
    def alone(self) -> bool:
        """Is a node of this kind a kernel of its own, read by others from the next stage on?"""
        return self in (NodeKind.SCATTER, NodeKind.SCAN)


def classify(node: Node, graph: Graph) -> tuple[NodeKind, str]:
    """(kind, reason): how `node` lowers, and why when it runs as an ATen call."""
    target = node.target
    if target is operator.getitem:
        return NodeKind.EXTERN, "getitem of a multi-output op"
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return NodeKind.EXTERN, f"{target} is not an ATen op"
    name = target._opname
    kind = (
        NodeKind.POINTWISE
        if name in POINTWISE
        else NodeKind.VIEW
        if name in VIEWS or name in INDEXED
        else NodeKind.REDUCTION
        if name in REDUCERS
        else NodeKind.SCATTER
        if name in scatters.SCATTERS
        else NodeKind.SCAN
        if name in scans.SCANS
        else None
    )
    if kind is None:
        return NodeKind.EXTERN, f"aten.{name} has no pointwise, view or reduction lowering"
    if not isinstance(node.meta, TensorMeta):
        return NodeKind.EXTERN, f"aten.{name} returns {node.meta}"
    metas = [node.meta] + [graph[n].meta for n in node.inputs()]
    for meta in metas:
        if not isinstance(meta, TensorMeta):
            return NodeKind.EXTERN, f"aten.{name} reads a non-tensor value"
        if meta.dtype not in dtypes.SUPPORTED:
            return NodeKind.EXTERN, f"dtype {meta.dtype} is not supported in kernels"
        if meta.device != node.meta.device:
            return NodeKind.EXTERN, f"aten.{name} mixes devices"
    if name == "_to_copy" and bind(node).get("device") not in (None, node.meta.device):
        return NodeKind.EXTERN, "aten._to_copy moves data between devices"
    if name in SPECIAL_SUPPORT and not SPECIAL_SUPPORT[name](node, graph):
        return NodeKind.EXTERN, f"aten.{name} with these arguments has no in-kernel lowering"
    if kind is NodeKind.REDUCTION and (why := reductions.supported(node, graph)):
        return NodeKind.EXTERN, why
    if kind is NodeKind.SCATTER and (why := scatters.unsupported(node, graph)):
        return NodeKind.EXTERN, why
    if kind is NodeKind.SCAN and (why := scans.unsupported(node, graph)):
        return NodeKind.EXTERN, why
    return kind, ""
