"""Kernels of kind "scatter": atomic adds, or stores, at indexes a tensor holds (plan/steps.py
`ScatterKernel`).

The kernel walks its values' space as a flat `offsets` range, `BLOCK_SIZE` elements a program,
like a pointwise kernel. At each point it computes the value (its producers inlined through the
lowering rules: an embedding gradient's `where(mask, 0, grad)` is one line, never written; a
key's rotary embedding before the cache it goes into), loads the index tensors there, wraps
negative indexes as eager does (index_put), checks them in bounds (`Op.check`, raised as eager's
IndexError), and adds the value into the output element they name with
`tl.atomic_add(..., sem="relaxed")` (duplicate indexes add up in any order), or stores it there
(`index_put` without accumulate). The output buffer is allocated filled (a zero table) or as a
copy of the scatter's `self` before the launch (`allocation`), or is that `self` itself where it
is a mutated input whose new value the scatter is (codegen/reuse.py `scatter_written_in_place`:
a static KV cache). The launch is never tuned by timing (ScatterLaunch): each timed run would add
into the output again. Template: scatter.py.j2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, paren
from minicomp.ir import Ref, dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Dyn, Expr, IterationSpace, size
from minicomp.lowering.ops.core import broadcast_index
from minicomp.lowering.ops.indexed import bounds
from minicomp.lowering.ops.scatters import scatter_of
from minicomp.plan.fusion import Plan
from minicomp.plan.steps import ScatterKernel
from minicomp.runtime.launch_spec import ScatterLaunch


@dataclass(kw_only=True)
class ScatterSource(KernelSource):
    """A scatter kernel's text and its launch fields."""

    kind: ClassVar[str] = "scatter"
    template: ClassVar[str] = "scatter.py.j2"
    numel_param: ClassVar[str] = "n_elements"

    def launch_spec(self) -> ScatterLaunch:
        return ScatterLaunch(numel=self.numel)


def write(plan: Plan, kernel: ScatterKernel) -> ScatterSource:
    return ScatterWriter(plan, kernel).write()


def allocation(plan: Plan, kernel: ScatterKernel, empty_of) -> tuple[str, set[str]]:
    """(the wrapper line that makes the output buffer with its starting value, the names it
    touches): filled (a memset) or a copy of `self` (the caller's input is never added into).
    `empty_of(meta, stride)`: the expression of a new buffer (codegen/module.py)."""
    name = kernel.stores[0]
    empty = empty_of(plan.graph[name].meta, plan.strides[name])
    if kernel.base is not None:
        return f"{name} = {empty}.copy_({kernel.base})  # starts as {kernel.base}", {name, kernel.base}
    if kernel.fill == 0:
        return f"{name} = {empty}.zero_()", {name}
    return f"{name} = {empty}.fill_({kernel.fill!r})", {name}


class ScatterWriter(KernelWriter):
    tile = "[BLOCK_SIZE]"
    root_mask = "mask"
    reserved = ("offsets", "mask", "pid")

    def __init__(self, plan: Plan, kernel: ScatterKernel):
        self.scatter = scatter_of(plan.graph[kernel.stores[0]], plan.graph)
        super().__init__(plan, kernel, IterationSpace(kernel.shape))

    def write(self) -> ScatterSource:
        graph, name = self.graph, self.kernel.stores[0]
        node, meta = graph[name], graph[name].meta
        wide = needs_wide_index(self.plan, self.space.numel, [*self.kernel.loads, name])
        root = tuple(self.space.var(k) for k in range(len(self.kernel.shape)))
        op = ops.Op(node, graph, self, root, ())
        at = self.scatter.value_index(graph, root)
        skipped = self._zero_where(self.scatter.values, at) if self.scatter.accumulate else None
        lanes = "mask" if skipped is None else f"mask & {skipped[0]}"
        value = self.value(self.scatter.values, at) if skipped is None else skipped[1]
        offset = Expr()
        for d, (target, stride, extent) in enumerate(
            zip(self.scatter.destination(graph, root), self.plan.strides[name], meta.shape)
        ):
            if isinstance(target, tuple):
                target = Expr.of(Dyn(self._position(op, d, *target, wide), extent))
            if extent > 1:
                offset = offset + target * stride
        added = ops.cast(value, meta.dtype)
        # (an output of one element: every lane adds into it)
        address = f"tl.full([BLOCK_SIZE], {size(offset.const)}, tl.int32)" if offset.is_const else self.address(offset)
        if self.scatter.accumulate:
            store = f'tl.atomic_add(out_ptr + {paren(address)}, {added}, mask={lanes}, sem="relaxed")'
        else:
            store = f"tl.store(out_ptr + {paren(address)}, {added}, mask={lanes})"
        defs = [f"x{v.dim} = {self.space.definition(v)}" for v in sorted(self.vars, key=lambda v: v.dim)]
        return ScatterSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=list(self.pointers.values()) + ["out_ptr"],
            args=list(self.pointers) + [name],
            numel=self.space.numel,
            header=self._header(),
            body=defs + self.plain_loads + self.lines + [store],
            wide_index=wide,
        )

    def _zero_where(self, name: str, index: tuple[Expr, ...]) -> tuple[str, ops.Value] | None:
        """For values `where(c, 0, v)` (or `where(c, v, 0)`), computed here: (the lanes that add
        `v`, v). The others add nothing: the padding and out-of-range rows of an embedding's
        gradient make no atomic add, where every padding token of a batch would add its zeros to
        one row. Exact: an output that starts filled with anything but -0.0 never holds -0.0
        (x + -x is +0.0), so adding +0.0 to it changes nothing. Else None."""
        node, fill = self.graph[name], self.kernel.fill
        if name in self.loads or node.op_name != "where" or fill is None:
            return None
        if fill == 0 and math.copysign(1, fill) < 0:  # -0.0: adding +0.0 would make it +0.0
            return None
        args = ops.bind(node)
        for zero, kept, taken in (("self", "other", "== 0"), ("other", "self", "!= 0")):
            if _is_zero(self.graph, args[zero]) and isinstance(args[kept], Ref):
                cond = args["condition"].name
                c = self.value(cond, broadcast_index(index, self.graph[cond].meta.shape))
                v = self.value(args[kept].name, broadcast_index(index, self.graph[args[kept].name].meta.shape))
                compute = dtypes.compute_dtype(node.meta.dtype)
                return f"({c.code} {taken})", ops.Value(ops.cast(v, compute), compute)
        return None

    def _position(self, op: ops.Op, d: int, tensor: str, at: tuple[Expr, ...], wide: bool) -> str:
        """The output index along dim `d` that index tensor `tensor` holds at `at`: checked in
        bounds as eager checks it, a negative one counted from the end where the op does (index_put)."""
        extent = self.graph[op.node.name].meta.shape[d]
        raw = self.value(tensor, at)
        low = -extent if self.scatter.wraps else 0
        lo, hi = _clamped(self.graph, tensor)
        if not (low <= lo and hi < extent):  # (an embedding's gradient clamps its indexes: no check)
            op.check(
                bounds(raw.code, extent, self.scatter.wraps),
                f"index out of bounds for dimension {d} ({self.scatter.op})",
                cuda=True,
            )
        code = raw.code
        if self.scatter.wraps and lo < 0:
            code = self.temp(
                f"tl.where({code} < 0, {code} + {size(extent)}, {code})", raw.dtype, f"{tensor}_wrapped"
            ).code
        dtype = torch.int64 if wide or extent >= 2**31 else torch.int32
        if raw.dtype != dtype:
            code = self.temp(f"{code}.to({dtypes.triton_dtype(dtype)})", dtype, f"{tensor}_at").code
        return code

    def _header(self) -> list[str]:
        k = self.kernel
        space = " x ".join(map(str, k.shape)) or "scalar"
        start = f"as {k.base}" if k.base else f"filled with {k.fill!r}"
        return [
            f"kernel {k.index}: {', '.join(k.nodes)}",
            f"  aten ops: {', '.join(dict.fromkeys(k.op_names))}",
            f"  scatter over [{space}] into {k.stores[0]} (starts {start}): "
            + ("atomic adds" if self.scatter.accumulate else "stores"),
            f"  reads {', '.join(k.loads) or '-'}; writes {', '.join(k.stores)}",
        ]


def _clamped(graph, name: str) -> tuple[float, float]:
    """Bounds an index tensor's values are known to lie in: a clamp's, else none."""
    node = graph[name]
    lo, hi = float("-inf"), float("inf")
    if not node.is_input and node.op_name in ("clamp", "clamp_min", "clamp_max"):
        args = ops.bind(node)
        if isinstance(args.get("min"), int):
            lo = args["min"]
        if isinstance(args.get("max"), int):
            hi = args["max"]
    return lo, hi


def _is_zero(graph, arg) -> bool:
    """Whether a `where` branch is the constant zero: a Python 0, or a 0 `scalar_tensor` or `full`."""
    if not isinstance(arg, Ref):
        return isinstance(arg, (int, float)) and not isinstance(arg, bool) and arg == 0
    node = graph[arg.name]
    if node.is_input or node.op_name not in ("scalar_tensor", "full"):
        return False
    value = ops.bind(node).get("s" if node.op_name == "scalar_tensor" else "fill_value")
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
