"""Scatter ops (`index_put`, `scatter_add`): a kernel of their own kind (plan/steps.py
`ScatterKernel`, codegen/scatter.py).

Such an op puts each element of its values into the output at a place that index tensors name:
an embedding's gradient adds row i of the incoming gradient into row idx[i] of a zero table; a
static KV cache's update stores a token's keys at its position. The kernel walks the values'
space, computes each value there (its pointwise producers inlined, as a pointwise kernel
computes what it stores), loads the index tensors and adds the value into the output with an
atomic add (`index_put` with accumulate=True, `scatter_add`: duplicates in the index add up, as
in eager) or stores it (`index_put` without accumulate: which of duplicates wins is unspecified,
as in eager). `Scatter` says, for one node, what that space is, where the values and the index
tensors are read at a point of it, and which output element the point goes into. `unsupported`
says why a node stays an ATen call: atomics of the output's dtype that the device lacks
(Inductor's `needs_fallback_due_to_atomic_add_limitations`: bfloat16 only on sm90+ GPUs, never
int64 or bool; Triton's interpreter has no bfloat16 atomics), deterministic algorithms asked for
(atomic adds sum in any order; eager's deterministic store keeps the last duplicate), boolean
masks among the indices, an empty space. A `None` among index_put's indices (`x[:, i, j]`) takes
its dim whole, where eager's indexing puts it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minicomp.ir import Graph, Node, Ref, TensorMeta
from minicomp.lowering.indexing import Expr
from minicomp.lowering.ops.core import bind, broadcast_index

SCATTERS = ("index_put", "scatter_add")  # the ops a scatter kernel computes
INDEX_DTYPES = (torch.int64, torch.int32)
ATOMIC_DTYPES = (torch.float32, torch.float16, torch.float64, torch.int32)  # + bfloat16 on sm90+


@dataclass(frozen=True)
class Scatter:
    """One scatter-accumulate node, as its kernel walks it."""

    base: str  # `self`: the tensor the sums start from (the output's initial value)
    values: str  # the node whose elements are added
    space: tuple[int, ...]  # the iteration space: the values' (broadcast) shape
    op: str  # "index_put" or "scatter_add"
    indices: tuple[str, ...]  # index tensors: index_put's (not its Nones); scatter_add's one
    dims: tuple[int, ...] = (0,)  # the output dim each index tensor names
    wraps: bool = True  # a negative index counts from the end (index_put), else it is out of bounds
    accumulate: bool = True  # added into the output (atomically), else stored over it

    @property
    def first(self) -> int:
        """Where the indices' broadcast dims lie in the space: in place of the dims they index when
        those are adjacent (`x[:, i, j]`), else first (`x[i, :, j]`), as eager's indexing puts them."""
        adjacent = self.dims == tuple(range(self.dims[0], self.dims[0] + len(self.dims)))
        return self.dims[0] if adjacent else 0

    def value_index(self, graph: Graph, root: tuple[Expr, ...]) -> tuple[Expr, ...]:
        """Where the values are read at point `root` of the space."""
        if self.op == "scatter_add":  # src may be larger than index: read at the same point
            return root
        return broadcast_index(root, graph[self.values].meta.shape)

    def destination(self, graph: Graph, root: tuple[Expr, ...]) -> list[Expr | tuple[str, tuple[Expr, ...]]]:
        """The output element point `root` adds into, a dim at a time: an index of the space, or
        (index tensor, where it is read) for a dim an index tensor names."""
        ndim = graph[self.base].meta.ndim
        if self.op == "scatter_add":
            return [(self.indices[0], root) if d == self.dims[0] else root[d] for d in range(ndim)]
        width = len(self.space) - (ndim - len(self.dims))  # dims of the indices' broadcast shape
        at = root[self.first : self.first + width]
        rest = iter(root[: self.first] + root[self.first + width :])  # the dims no index names, in order
        by_dim = dict(zip(self.dims, self.indices))
        return [
            (by_dim[d], broadcast_index(at, graph[by_dim[d]].meta.shape)) if d in by_dim else next(rest)
            for d in range(ndim)
        ]


def scatter_of(node: Node, graph: Graph) -> Scatter:
    """The `Scatter` of a node that `unsupported` accepts."""
    args = bind(node)
    base = args["self"].name
    if node.op_name == "scatter_add":
        d = args["dim"] % max(node.meta.ndim, 1)
        index = args["index"].name
        return Scatter(base, args["src"].name, graph[index].meta.shape, "scatter_add", (index,), (d,), wraps=False)
    dims = tuple(d for d, r in enumerate(args["indices"]) if r is not None)
    indices = tuple(args["indices"][d].name for d in dims)
    lead = tuple(torch.broadcast_shapes(*(graph[n].meta.shape for n in indices)))
    shape = node.meta.shape
    rest = tuple(n for d, n in enumerate(shape) if d not in dims)
    accumulate = bool(args.get("accumulate"))
    scatter = Scatter(base, args["values"].name, (), "index_put", indices, dims, accumulate=accumulate)
    first = scatter.first
    return replace(scatter, space=rest[:first] + lead + rest[first:])


def unsupported(node: Node, graph: Graph) -> str:
    """Why `node` (an op of SCATTERS) stays an ATen call, or "" when a scatter kernel computes it."""
    name, meta, args = node.op_name, node.meta, bind(node)
    stores = name == "index_put" and not args.get("accumulate")
    if torch.are_deterministic_algorithms_enabled():
        return f"aten.{name}: deterministic algorithms are on, and a scatter kernel's duplicates land in any order"
    if not stores and (why := _atomics(meta)) is not None:
        return f"aten.{name} into {meta.dtype} on {meta.device}: {why}"
    if meta.ndim == 0:
        return f"aten.{name} into a 0-d tensor"
    if name == "index_put":
        indices = args["indices"]
        if len(indices) > meta.ndim or not any(isinstance(i, Ref) for i in indices):
            return "aten.index_put without an index tensor"
        values = args["values"]
        if not isinstance(values, Ref):
            return "aten.index_put of a scalar value"
        metas = [graph[i.name].meta for i in indices if i is not None]
        if any(not isinstance(m, TensorMeta) or m.dtype not in INDEX_DTYPES for m in metas):
            return "aten.index_put with a boolean mask (or a non-integer index) among its indices"
        try:
            space = scatter_of(node, graph).space
            torch.broadcast_shapes(graph[values.name].meta.shape, space)
        except RuntimeError:
            return "aten.index_put whose values do not broadcast to the indexed shape"
        if graph[values.name].meta.dtype != meta.dtype:
            return "aten.index_put of values of another dtype"
    else:
        index, src = graph[args["index"].name].meta, args.get("src")
        if not isinstance(src, Ref) or graph[src.name].meta.dtype != meta.dtype or index.dtype != torch.int64:
            return "aten.scatter_add of this src or index"
        d = args["dim"] % meta.ndim
        src_meta = graph[src.name].meta
        if index.ndim != meta.ndim or src_meta.ndim != meta.ndim:
            return "aten.scatter_add whose index, src and self differ in rank"
        if any(n > s for n, s in zip(index.shape, src_meta.shape)) or any(
            n > s for k, (n, s) in enumerate(zip(index.shape, meta.shape)) if k != d
        ):
            return "aten.scatter_add whose index is larger than src or self"
        space = index.shape
    if any(s == 0 for s in space):
        return f"aten.{name} of no values"
    return ""


def _atomics(meta: TensorMeta) -> str | None:
    """Why the device cannot add `meta.dtype` atomically, or None (Inductor's rule)."""
    if meta.dtype == torch.bfloat16:
        if meta.device.type == "cuda" and torch.cuda.get_device_capability(meta.device) >= (9, 0):
            return None
        return "bfloat16 atomic adds need an sm90+ GPU (Triton's interpreter has none)"
    if meta.dtype not in ATOMIC_DTYPES:
        return "no atomic add of this dtype"
    return None
