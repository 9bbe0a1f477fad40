"""Scans (`cumsum`, `cumprod`, `logcumsumexp`): a kernel of their own kind (plan/steps.py
`ScanKernel`, codegen/scan.py).

A scan along dim d of x writes, at each point, the combination of x's elements along d up to
and including that point: out[..., j, ...] = x[..., 0, ...] (+) ... (+) x[..., j, ...]. Its
kernel walks the value's space as a reduction kernel walks rows: the other dims are its rows,
d its second tile axis, and `tl.associative_scan` combines along that axis (a row longer than
a tile carries the combination of the tiles before it). `Scan` says, for one node, what it
scans, along which dim, with which combine function of the generated module
(templates/combine.py.j2), and the dtype it accumulates in: float32 for 16-bit floats, as
eager's CUDA scans do, and the result's dtype otherwise (an integer cumsum counts in int64).
`unsupported` says why a node stays an ATen call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.ir import Graph, Node, Ref, TensorMeta, dtypes
from minicomp.lowering.ops.core import bind

# op -> its combine function: a key of lowering/ops/reductions.COMBINES, or "logaddexp"
SCANS = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logaddexp"}


@dataclass(frozen=True)
class Scan:
    """One scan node, as its kernel walks it."""

    source: str  # the node whose elements are combined
    dim: int  # the dim it scans along (non-negative)
    combine: str  # "sum", "prod" or "logaddexp"
    acc: torch.dtype  # the dtype the running combination is held in

    @property
    def helper(self) -> str:
        """The generated module's @triton.jit combine function (templates/combine.py.j2)."""
        return f"_{self.combine}"

    def identity(self) -> str:
        """The value a lane past the row contributes: 0 to a sum, 1 to a product, -inf to a logaddexp."""
        if self.combine == "logaddexp":
            return 'float("-inf")'
        one = self.combine == "prod"
        return ("1.0" if one else "0.0") if self.acc.is_floating_point else ("1" if one else "0")


def scan_of(node: Node, graph: Graph) -> Scan:
    """How `node` (a scan, by SCANS) scans."""
    args = bind(node)
    source = graph[args["self"].name].meta
    dim = args["dim"] % max(source.ndim, 1)
    return Scan(args["self"].name, dim, SCANS[node.op_name], dtypes.compute_dtype(node.meta.dtype))


def unsupported(node: Node, graph: Graph) -> str:
    """'' when `node` can be a scan kernel, else why not."""
    args = bind(node)
    if not isinstance(args.get("self"), Ref) or not isinstance(graph[args["self"].name].meta, TensorMeta):
        return "scans a non-tensor value"
    source = graph[args["self"].name].meta
    if source.ndim == 0:
        return f"aten.{node.op_name} of a 0-d tensor"
    if source.numel == 0:
        return f"aten.{node.op_name} of an empty tensor"
    if node.op_name == "logcumsumexp" and not node.meta.dtype.is_floating_point:
        return "aten.logcumsumexp of an integer tensor"
    if node.meta.dtype == torch.bool:
        return f"aten.{node.op_name} into a bool result"
    return ""
