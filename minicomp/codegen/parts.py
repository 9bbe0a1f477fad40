"""Walking a dim of a kernel's iteration space in parts, cut at the boundaries of cat and slice.

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

The writer first runs without parts, recording each comparison of a single
iteration variable with a constant as a boundary of that variable's range
(`boundaries`); `choose` then takes the innermost variable whose boundaries
cut its range into at most `config.get("max_parts")` equal parts, and the writer runs again
walking it in those parts. Parts are written one after another in the same program, so
each program handles P * BLOCK_SIZE elements.

Interleaved parts. GPT-J's rotary pairs elements 2i and 2i + 1
(`stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`) and its gradient
scatters into strided slices: the comparisons are of `x3 % 2`, or of
`(x3 - 1) % 2 == 0`. Such a comparison records its period (`periods`), and
where no dim is cut into runs, `choose` walks the dim as P interleaved parts,
x3 = P*i + p: part 0 the even elements, part 1 the odd ones, `x3 % 2` decided
in each. The two parts read and write adjacent addresses; codegen/pointwise.py
loads such a pair with one contiguous load of 2 * BLOCK_SIZE elements split in
two (`tl.split`) and stores it joined, so the loads stay full-width vectors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp import config
from minicomp.lowering.indexing import Expr, IterationSpace, Var

MIN_RUN = 16  # elements of a part along the innermost dim: enough for full-width vector loads


@dataclass(frozen=True)
class Parts:
    """A dim walked in `count` parts."""

    dim: int  # the iteration-space dim walked in parts
    count: int  # P
    size: int  # m: each part's extent; the space has m in place of P * m
    interleaved: bool = False  # part p holds elements P*i + p, not p*m + i

    def describe(self, full: int) -> str:
        if self.interleaved:
            return f"dim {self.dim} ({full}) walked as {self.count} interleaved parts (element {self.count}*i + part)"
        return f"dim {self.dim} ({full}) walked as {self.count} parts of {self.size}"

    def position(self, var, part: int):
        """The index along the dim walked in parts of element `var` of part `part`."""
        return var * self.count + part if self.interleaved else var + part * self.size


def choose(space: IterationSpace, boundaries: dict[int, set[int]], periods: dict[int, set[int]]) -> Parts | None:
    """The innermost dim whose recorded boundaries cut it into 2..max_parts equal parts
    (config.py: the kernel body is written once per part); failing that, the innermost dim
    whose recorded periods divide it, in as many interleaved parts as their least common
    multiple, if at most max_parts."""
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
        return Parts(dim, size // part, part)
    for dim in sorted(periods, reverse=True):
        size, parts = space.shape[dim], math.lcm(*periods[dim])
        if 2 <= parts <= max_parts and size % parts == 0:
            return Parts(dim, parts, size // parts, interleaved=True)
    return None


def period(expr: Expr, modulus: int) -> tuple[int, int] | None:
    """(dim, P) when `expr` is `c*x + k` of one iteration variable x, so that `expr % modulus`
    repeats every P = modulus / gcd(c, modulus) values of x; None if P is 1 or expr is not
    of that form."""
    if len(expr.terms) != 1 or not isinstance(expr.terms[0][0], Var):
        return None
    var, coeff = expr.terms[0]
    repeat = modulus // math.gcd(coeff, modulus)
    return (var.dim, repeat) if repeat > 1 else None


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
