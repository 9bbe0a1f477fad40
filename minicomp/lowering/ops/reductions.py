"""Reductions: what each ATen reduction reduces, over which dims, and how it accumulates.

A reduction kernel (codegen/reduction.py) needs three things from a reduction
node, and the fusion plan needs the first two to group reductions that can
share a kernel:

* the value it reduces (`source`) and that value's reduced dims (`dims`);
* how partial results combine (`combine`: a function of the generated module,
  see COMBINES) and the dtype they accumulate in: float32 for 16-bit floats,
  int64 for integer sums, as eager does;
* how the accumulated value becomes the result (`mean` divides by the count).

Everything a decomposition builds out of these (var as a mean and a sum of
squares: two passes, the way eager computes it; softmax as amax, exp, sum;
layer_norm; cross-entropy) needs no rule of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.ir import Graph, Node, Ref, TensorMeta, dtypes
from minicomp.lowering.ops.core import bind


@dataclass(frozen=True)
class Reduction:
    source: str  # the node whose values are reduced
    dims: tuple[int, ...]  # its reduced dims, ascending
    keepdim: bool
    combine: str  # a key of COMBINES
    acc: torch.dtype  # the dtype partial results are held in
    divide: int = 1  # the result is the accumulated value / divide (mean)
    truth: bool = False  # any / all: reduces `x != 0` (held in int8) and returns bool


# combine -> (identity as Triton source for a dtype class, combine function of two accumulators).
# The combine functions are @triton.jit helpers every module with a reduction defines
# (templates/module.py.j2); max and min propagate NaN like eager's amax and amin.
COMBINES = {
    "sum": {"float": "0.0", "int": "0"},
    "prod": {"float": "1.0", "int": "1"},
    "max": {"float": 'float("-inf")', "int": "{min}"},
    "min": {"float": 'float("inf")', "int": "{max}"},
    "argmax": {"float": 'float("-inf")', "int": "{min}"},
    "argmin": {"float": 'float("inf")', "int": "{max}"},
}


def identity(combine: str, dtype: torch.dtype) -> str:
    """The value a masked lane contributes: 0 to a sum, -inf to a max."""
    if dtype.is_floating_point:
        return COMBINES[combine]["float"]
    info = torch.iinfo(dtype) if dtype != torch.bool else torch.iinfo(torch.int8)
    return COMBINES[combine]["int"].format(min=info.min, max=info.max)


def helper(combine: str, dtype: torch.dtype) -> str:
    """The name of the module's combine function for `combine` on `dtype`."""
    if combine in ("max", "min", "argmax", "argmin") and dtype.is_floating_point:
        return f"_{combine}_nan"
    return f"_{combine}"


def _dims(node: Node, graph: Graph, dim) -> tuple[int, ...]:
    source = graph[node.args[0].name].meta
    ndim = source.ndim
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return tuple(sorted({d % max(ndim, 1) for d in dims})) if ndim else ()


def spec(node: Node, graph: Graph) -> Reduction:
    """How `node` (a reduction, by REDUCERS) reduces."""
    args = bind(node)
    name = node.op_name
    source = args["self"].name
    src = graph[source].meta
    out = node.meta.dtype
    dims = _dims(node, graph, args.get("dim"))
    keepdim = bool(args.get("keepdim", False))
    count = 1
    for d in dims:
        count *= src.shape[d]
    if name in ("sum", "prod"):
        return Reduction(source, dims, keepdim, name, dtypes.compute_dtype(out))
    if name == "mean":
        return Reduction(source, dims, keepdim, "sum", dtypes.compute_dtype(out), divide=count)
    if name in ("amax", "amin"):
        return Reduction(source, dims, keepdim, "max" if name == "amax" else "min", dtypes.compute_dtype(out))
    if name in ("any", "all"):  # a max / min of `x != 0` held in int8
        return Reduction(source, dims, keepdim, "max" if name == "any" else "min", torch.int8, truth=True)
    if name in ("argmax", "argmin"):
        return Reduction(source, dims, keepdim, name, dtypes.compute_dtype(src.dtype))
    raise KeyError(name)


REDUCERS = {"sum", "prod", "mean", "amax", "amin", "any", "all", "argmax", "argmin"}


def supported(node: Node, graph: Graph) -> str:
    """'' when `node` can be a reduction in a kernel, else why not."""
    args = bind(node)
    if not isinstance(args.get("self"), Ref):
        return "reduces a non-tensor value"
    src = graph[args["self"].name].meta
    if not isinstance(src, TensorMeta):
        return "reduces a non-tensor value"
    if src.numel == 0:
        return "reduces an empty tensor"
    name = node.op_name
    if name in ("amax", "amin", "argmax", "argmin", "prod") and src.dtype == torch.bool:
        return f"aten.{name} of a bool tensor"
    if name in ("sum", "prod") and args.get("dtype") is not None and args["dtype"] != node.meta.dtype:
        return f"aten.{name} with a dtype argument"
    rounds = args.get("dtype")
    if name in ("sum", "prod") and rounds in dtypes.LOW_PRECISION and src.dtype not in (rounds, torch.bool):
        # eager rounds each element to `dtype` first (1e5 is inf in float16): a kernel would cast it
        # straight to its float32 accumulator
        return f"aten.{name} with dtype={rounds} of a {src.dtype} tensor (each element rounded first)"
    return ""
