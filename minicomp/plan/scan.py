"""Scan kernels in the plan: where a scan node (lowering/ops/scans.py) runs and how its kernel
walks it.

A scan kernel computes one node. The value it scans fuses into it as values fuse into a
pointwise kernel's store (its producers recomputed inline, never written), unless a reduction
kernel of the same stage computes it: then the scan waits a stage and reads it from memory.
Readers of the result wait for the kernel: the result is available one stage later, as a
scatter's is (`NodeKind.alone`, scatter.py `input_stage`). The kernel walks the scanned value's
space as a reduction kernel walks rows (reduction_space.py): the scanned dim held whole in a
tile where it is short enough (the reduction kernel's persistent limit), else walked config
"scan_block" elements at a time with the running combination of the tiles before carried along.
"""

from __future__ import annotations

from minicomp import config
from minicomp.ir import Graph
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.scans import scan_of
from minicomp.plan.reduction_space import row_itemsize
from minicomp.plan.scatter import after_reductions
from minicomp.plan.steps import Refusal, ScanKernel


def stage_of(graph: Graph, kinds, name: str, stage, space) -> tuple[int, Refusal | None]:
    """(the stage of scan `name`'s kernel, why it is later than its input's)."""
    return after_reductions(kinds, stage, space, name, graph[name].inputs(), "scans")


def materialized(graph: Graph, kinds) -> set[str]:
    """Scan results: their kernels write them."""
    return {name for name in graph.order if kinds[name] is NodeKind.SCAN}


def kernels(graph: Graph, kinds, stage) -> list[ScanKernel]:
    """A kernel for each scan node, over the space of the value it scans."""
    found = []
    for name in graph.order:
        if kinds[name] is not NodeKind.SCAN:
            continue
        scan = scan_of(graph[name], graph)
        meta = graph[scan.source].meta
        looped, rblock = _form(meta.shape[scan.dim], row_itemsize(graph, scan.source))
        found.append(ScanKernel(0, stage[name], meta.shape, [name], reduced=(scan.dim,), looped=looped, rblock=rblock))
    return found


def _form(extent: int, itemsize: int) -> tuple[bool, int]:
    """(looped, RBLOCK) of a scan over rows of `extent` elements whose widest input has elements of
    `itemsize` bytes: held whole within the reduction kernel's persistent limits (config
    "persistent_rows", "persistent_bytes"), else config "scan_block" elements a step
    (benchmarks/experiments/scan_forms.py), whichever dim the rows run along."""
    whole = max(1 << (extent - 1).bit_length(), 2)
    if extent <= config.get("persistent_rows") and extent * itemsize <= config.get("persistent_bytes"):
        return False, whole
    return True, min(config.get("scan_block"), whole)
