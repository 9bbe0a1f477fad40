"""Splitting a kernel's iteration space at the boundaries of cat and slice.

`cat`, `slice_scatter`, `slice_backward`, `select_scatter` and
`constant_pad_nd` choose per element between inputs by comparing an index
with a constant: RoPE's `rotate_half` builds

    cat = tl.where(x3 < 64, -q[x3 + 64], q[x3 - 64])

with both loads masked to their half, so every element of q is loaded three
times (once plain, twice half-masked) and every lane evaluates both sides.
If the iteration space walks that dim in P parts of m elements, x3 = p*m + i
with p a constant of the kernel text, each comparison is decided while the
kernel is written (`KernelWriter.compare`): part 0 reads `-q[i + 64]`, part 1
reads `q[i]`, and those are the same two loads the `q * cos` term of the
other part needs. Every element is loaded once, and no lane selects.

The writer first runs without a split, recording each comparison of a single
iteration variable with a constant as a boundary of that variable's range
(`boundaries`); `choose` then takes the innermost variable whose boundaries
cut its range into at most `config.get("max_parts")` equal parts, and the writer runs again
with that split. Parts are written one after another in the same program, so
each program handles P * BLOCK_SIZE elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp import config
from minicomp.indexing import IterationSpace

MIN_RUN = 16  # elements of a part along the innermost dim: enough for full-width vector loads


@dataclass(frozen=True)
class Split:
    dim: int  # the iteration-space dim walked in parts
    parts: int  # P
    size: int  # m: each part's extent; the space has m in place of P * m

    def describe(self, full: int) -> str:
        return f"dim {self.dim} ({full}) walked as {self.parts} parts of {self.size}"


def choose(space: IterationSpace, boundaries: dict[int, set[int]]) -> Split | None:
    """The innermost dim whose recorded boundaries cut it into 2..max_parts equal parts
    (config.py: the kernel body is written once per part)."""
    max_parts = config.get("max_parts")
    live = [d for d, s in enumerate(space.shape) if s > 1]
    for dim in sorted(boundaries, reverse=True):
        size = space.shape[dim]
        cuts = {b for b in boundaries[dim] if 0 < b < size}
        if not cuts:
            continue
        part = math.gcd(size, *cuts)
        if size // part > max_parts or (dim == live[-1] and part < MIN_RUN):
            continue
        return Split(dim, size // part, part)
    return None


def boundary(coeff: int, offset: int, relation: str, bound: int) -> list[int]:
    """Where `coeff * x + offset <relation> bound` changes truth, as values of x:
    the least x on the upper side (x >= b is one side, x < b the other)."""
    if relation == "==":
        return boundary(coeff, offset, ">=", bound) + boundary(coeff, offset, ">=", bound + 1)
    # coeff * x >= bound - offset
    rhs = bound - offset
    if coeff > 0:
        return [-(-rhs // coeff)]  # x >= ceil(rhs / coeff)
    return [rhs // coeff + 1]  # x <= floor(rhs / coeff): the upper side starts one past it
