"""What a reduction kernel walks (`ReductionSpace`) and how (`reduction_form`): persistent or
looped, its RBLOCK, whether its rows are contiguous. Shared by the plan (fusion.py) and the
Graph -> Graph stage before it (split_reductions.py), which decides splits from the same form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp import config


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


def reduction_form(space: ReductionSpace, stride: tuple[int, ...] | None = None) -> tuple[bool, int, bool]:
    """(looped, RBLOCK, outer) of a kernel over `space` whose reduced value has `stride`.

    Rows up to config "persistent_rows" elements are held whole (RBLOCK the next power of
    two), longer ones walked config "loop_block" elements at a time. An *outer* reduction
    (its rows, not its reduced dims, are contiguous in memory: a bias gradient's sum(0)) takes
    config "outer_block" elements of a row a step, so that a program's many rows (XBLOCK)
    make each load one contiguous run."""
    extent, outer = space.extent, space.is_outer(stride)
    step = config.get("outer_block") if outer else config.get("loop_block")
    if extent <= (step if outer else config.get("persistent_rows")):
        return False, max(1 << (extent - 1).bit_length(), 2), outer
    return True, step, outer
