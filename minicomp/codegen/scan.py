"""Kernels of kind "scan": a running sum, product or logaddexp along one dim (plan/steps.py
`ScanKernel`).

The kernel is a reduction kernel's frame (templates/reduction.py.j2, `ReductionLaunch`): the
scanned value's other dims are its rows, along the tile's first axis, and the scanned dim runs
along its second. It computes the value there (its producers inlined through the lowering
rules, as a reduction kernel computes what it reduces), puts the combine's identity in the lanes
past the row, and combines along the row with `tl.associative_scan` and the module's combine
function (`_sum`, `_prod`, `_logaddexp`: templates/combine.py.j2), in float32 for 16-bit floats:

    x = tl.where(xmask & rmask, <the value>, 0).to(tl.float32)   # [XBLOCK, RBLOCK]
    scan = tl.associative_scan(x, 1, _sum)                       # the row's prefix sums

A dim longer than the reduction kernel's persistent limits is walked RBLOCK (config "scan_block")
elements at a time (plan/scan.py); each tile's scan is combined with the tiles before it (`carry`, a row tile
[XBLOCK, 1]), which then takes in the tile's own total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from minicomp.codegen.kernel import out_pointers
from minicomp.codegen.reduction import Phase, ReductionSource, ReductionWriter
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.scans import scan_of
from minicomp.plan.fusion import Plan
from minicomp.plan.steps import ScanKernel


@dataclass(kw_only=True)
class ScanSource(ReductionSource):
    """A scan kernel's text and its launch fields (a reduction kernel's: rows of `extent`)."""

    kind: ClassVar[str] = "scan"


def write(plan: Plan, kernel: ScanKernel) -> ScanSource:
    return ScanWriter(plan, kernel).write()


class ScanWriter(ReductionWriter):
    reserved = (*ReductionWriter.reserved, "carry")

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if self.plan.kinds[name] is not NodeKind.SCAN or name in self.loads:
            return super()._evaluate(name, index, mask)
        scan = scan_of(self.graph[name], self.graph)
        value = self.value(scan.source, index, mask)
        out = self.graph[name].meta.dtype
        if self.graph[scan.source].meta.dtype != out:  # `dtype=`: each element rounded to it first, as eager
            value = self.temp(ops.cast(value, out), out, "rounded")
        if self.extent == 1:  # (a dim of one element is its own scan)
            return ops.Value(ops.cast(value, scan.acc), scan.acc)
        acc = dtypes.triton_dtype(scan.acc)
        lanes = self.temp(
            f"tl.where(xmask & rmask, {ops.cast(value, scan.acc)}, {scan.identity()}).to({acc})", scan.acc, "lanes"
        )
        scanned = self.temp(f"tl.associative_scan({lanes.code}, 1, {scan.helper})", scan.acc, "scan")
        if not self.looped:
            return scanned
        carry = self.fresh("carry")  # the combination of the row's tiles before this one
        self.phase.before.append(f"{carry} = tl.full([XBLOCK, 1], {scan.identity()}, {acc})")
        result = self.temp(f"{scan.helper}({carry}, {scanned.code})", scan.acc, "scan")
        total = f"tl.reduce({lanes.code}, 1, {scan.helper})[:, None]"
        self.phase.body.append(f"{carry} = {scan.helper}({carry}, {total})")
        return result

    def write(self) -> ScanSource:
        (name,) = self.kernel.stores
        self.phase = Phase(stores=[name])
        self.phases = [self.phase]
        self.outs = outs = out_pointers(self.kernel.stores)
        self.phase.body.append(self._store(name, outs[name]))
        return self.source(ScanSource, outs)

    def _header(self) -> list[str]:
        k = self.kernel
        scan = scan_of(self.graph[k.stores[0]], self.graph)
        rows = " x ".join(str(s) for s in self.xspace.shape) or "1"
        return [
            f"kernel {k.index}: {', '.join(k.nodes)}",
            f"  aten ops: {', '.join(dict.fromkeys(k.op_names))}",
            f"  scan ({k.form}): {rows} rows of {self.extent} (dim {scan.dim} of {list(k.shape)}), "
            f"combined by {scan.helper} in {dtypes.short_name(scan.acc)}",
            f"  reads {', '.join(k.loads) or '-'}; writes {', '.join(k.stores)}",
        ]
