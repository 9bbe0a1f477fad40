"""What a reduction kernel walks (`ReductionSpace`) and how (`reduction_form`): persistent or
looped, its RBLOCK, whether its rows are contiguous; and how many tiles of rows its programs
take (`row_tiles`). Shared by the plan (fusion.py) and the Graph -> Graph stage before it
(split_reductions.py), which decides splits from the same form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp import config
from minicomp.lowering import ops
from minicomp.tiles import rows_per_program


@dataclass(frozen=True)
class ReductionSpace:
    """What a reduction kernel walks: `shape`, the reduced value's, and `dims`, the reduced ones.
    Its rows are the other dims; results broadcast back over `dims`."""

    shape: tuple[int, ...]
    dims: tuple[int, ...]
    device: object

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Can a value of `shape` be evaluated (and stored) at the kernel's index: the whole
        space, or its rows (reduced dims kept as 1 or dropped, or any view that adds or drops
        dims of size 1: a bias gradient's [1, 1, D])?"""
        rows = tuple(s for d, s in enumerate(self.shape) if d not in self.dims and s != 1)
        return tuple(shape) == self.shape or tuple(s for s in shape if s != 1) == rows

    @property
    def extent(self) -> int:
        """Elements of one row: the product of the reduced dims."""
        return math.prod(self.shape[d] for d in self.dims)

    @property
    def rows(self) -> int:
        return math.prod(s for d, s in enumerate(self.shape) if d not in self.dims)

    def is_outer(self, stride: tuple[int, ...] | None = None) -> bool:
        """Are the rows contiguous in memory rather than the reduced elements? Read from the
        reduced value's `stride` (its dim of smallest stride), else from the shape (its last dim)."""
        sized = [d for d, s in enumerate(self.shape) if s > 1]
        if not sized or all(d in self.dims for d in sized):
            return False
        known = stride is not None and len(stride) == len(self.shape)
        strided = [d for d in sized if known and stride[d] != 0]
        if not strided:
            return sized[-1] not in self.dims
        return min(strided, key=lambda d: (abs(stride[d]), -d)) not in self.dims

    def __str__(self) -> str:
        return f"{list(self.shape)} reduced over dims {list(self.dims)}"


def reduction_form(
    space: ReductionSpace, stride: tuple[int, ...] | None = None, itemsize: int = 0, takes_row_groups: bool = False
) -> tuple[bool, int, bool]:
    """(looped, RBLOCK, outer) of a kernel over `space` whose reduced value has `stride` and
    whose widest input of the space's shape has elements of `itemsize` bytes (`row_itemsize`).

    A row is held whole in registers (persistent: RBLOCK the next power of two) when it has up
    to config "persistent_rows" elements and up to config "persistent_bytes" bytes of its widest
    input, or when the kernel `takes_row_groups` of a column reduction (split_reductions.py:
    only a persistent kernel walks its rows in groups). Any other row is walked config
    "loop_block" elements at a time (fewer for a shorter row), a later pass reading it again
    from L2 (eviction hints, codegen/reduction.py): the registers a held row takes cost more
    than the second read (benchmarks/experiments/reduction_forms.py). An *outer* reduction
    (its rows, not its reduced dims, are contiguous in memory: a bias gradient's sum(0)) takes
    config "outer_block" elements of a row a step, so that a program's many rows (XBLOCK) make
    each load one contiguous run."""
    extent, outer = space.extent, space.is_outer(stride)
    whole = max(1 << (extent - 1).bit_length(), 2)
    if outer:
        step = config.get("outer_block")
        return (False, whole, True) if extent <= step else (True, step, True)
    if extent <= config.get("persistent_rows") and (
        takes_row_groups or extent * itemsize <= config.get("persistent_bytes")
    ):
        return False, whole, False
    return True, min(config.get("loop_block"), whole), False


def can_take_row_groups(space: ReductionSpace, stride: tuple[int, ...] | None = None) -> bool:
    """Can a kernel over `space` hold its rows whole, as one that takes row groups must?"""
    return not space.is_outer(stride) and space.extent <= config.get("persistent_rows")


def row_tiles(space: ReductionSpace, rblock: int) -> int:
    """The programs a kernel over `space` with `rblock` row elements a program takes when nothing
    is measured: tiles of `rows_per_program` rows (the runtime's untuned choice)."""
    return -(-space.rows // rows_per_program(space.rows, rblock))


def row_itemsize(graph, name: str) -> int:
    """Bytes an element of the widest value of `name`'s shape that `name` is computed from through
    pointwise ops and views: what a kernel reducing `name` reads a row of. Hugging Face's RMSNorm
    reduces x.float() ** 2: a bfloat16 x counts 2 bytes, not 4."""
    meta = graph[name].meta
    widest, seen, stack = 0, set(), [name]
    while stack:
        node = graph[stack.pop()]
        if node.name in seen:
            continue
        seen.add(node.name)
        if not node.is_input and ops.classify(node, graph)[0].fusible:
            stack += [i for i in node.inputs() if graph[i].meta.numel == meta.numel]
        elif node.meta.numel == meta.numel:
            widest = max(widest, node.meta.dtype.itemsize)
    return widest or meta.dtype.itemsize
