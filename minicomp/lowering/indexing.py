"""Index expressions: integer affine forms over the kernel's iteration variables.

A fused kernel walks one iteration space, a shape S, as a flat range of
`offsets`. Iteration variable k is the index along dim k of S:

    x_k = (offsets // P_k) % S_k          P_k = S[k+1] * ... * S[-1]

Every tensor value inside the kernel is evaluated at an index: one `Expr` per
dim of that value's shape. Views rewrite the index and never copy: a permute
reorders it, a slice scales and shifts it, a reshape divides and merges it with
// and %. A load finally turns an index into an address, sum(index_k * stride_k).

`Expr` keeps just enough algebra to make those indexes read like hand-written
ones: constants fold, multiples pull out of // and %, and at render time a run
of trailing variables whose strides match S collapses back into `offsets`
(so a contiguous load is `x_ptr + offsets`, which Triton vectorizes).

Every integer an index renders is a *size* (a dim, a stride, a slice bound)
and is written marked, `«64»`: a kernel family (codegen/families.py) may turn
sizes into runtime arguments, and only sizes. A literal that is a value of the
computation (`x + 3` on int8) or that Triton needs at compile time (a tile
shape, a reduction axis) is written plain and stays a constant.
`resolve_sizes` writes the marks as plain literals.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

SIZE = re.compile(r"«(\d+)»")


def size(n: int) -> str:
    """A non-negative integer that is a size, marked (the module docstring)."""
    if n < 0:
        raise ValueError(f"a size is non-negative, not {n}")
    return f"«{n}»"


def resolve_sizes(text: str) -> str:
    """`text` with every marked size written as a plain literal."""
    return SIZE.sub(r"\1", text)


@dataclass(frozen=True)
class Var:
    """Iteration variable `x{dim}` of an iteration space, 0 <= x < size."""

    dim: int
    size: int

    @property
    def bounds(self) -> tuple[int, int]:
        return 0, self.size - 1


@dataclass(frozen=True)
class FloorDiv:
    expr: Expr
    divisor: int

    @property
    def bounds(self) -> tuple[int, int]:
        lo, hi = self.expr.bounds
        return lo // self.divisor, hi // self.divisor


@dataclass(frozen=True)
class Mod:
    expr: Expr
    divisor: int

    @property
    def bounds(self) -> tuple[int, int]:
        lo, hi = self.expr.bounds
        return (0, min(hi, self.divisor - 1)) if lo >= 0 else (-(self.divisor - 1), self.divisor - 1)


@dataclass(frozen=True)
class Flat:
    """`(offsets // pitch) % count`: a run of adjacent variables at once, sum x_j * P_j / pitch.
    `wraps` is False when the run reaches the outermost dim, whose variable needs no `%`;
    `base` is the flat index of the space the run belongs to."""

    pitch: int
    count: int
    wraps: bool
    base: str = "offsets"

    @property
    def bounds(self) -> tuple[int, int]:
        return 0, self.count - 1


@dataclass(frozen=True)
class Dyn:
    """An index known only at run time: a gather's index tensor, evaluated in the kernel as
    the value named `code`, assumed to lie in 0 <= value < size. `full` says whether it varies
    along a reduction kernel's reduced dims (codegen/reduction.py)."""

    code: str
    size: int
    full: bool = True

    @property
    def bounds(self) -> tuple[int, int]:
        return 0, self.size - 1


Atom = Var | FloorDiv | Mod | Flat | Dyn


def _atom_order(atom: Atom):
    # Deterministic term order: variables by dim, then compound atoms by text.
    if isinstance(atom, Var):
        return (0, atom.dim, "")
    if isinstance(atom, Flat):
        return (1, 0, atom.base)
    return (2, 0, repr(atom))


@dataclass(frozen=True)
class Expr:
    """sum(coeff * atom) + const, with integer coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # -- construction -----------------------------------------------------
    @staticmethod
    def of(atom: Atom) -> Expr:
        return Expr(((atom, 1),))

    @staticmethod
    def _make(coeffs: dict, const: int) -> Expr:
        terms = tuple(sorted(((a, c) for a, c in coeffs.items() if c != 0), key=lambda t: _atom_order(t[0])))
        return Expr(terms, const)

    def __add__(self, other: Expr | int) -> Expr:
        if isinstance(other, int):
            return Expr(self.terms, self.const + other)
        coeffs = dict(self.terms)
        for atom, c in other.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Expr._make(coeffs, self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: Expr | int) -> Expr:
        return self + (other * -1)

    def __mul__(self, k: int) -> Expr:
        if k == 0:
            return Expr()
        return Expr(tuple((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    # -- queries ----------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    @cached_property
    def bounds(self) -> tuple[int, int]:
        lo = hi = self.const
        for atom, c in self.terms:
            a_lo, a_hi = atom.bounds
            lo += min(c * a_lo, c * a_hi)
            hi += max(c * a_lo, c * a_hi)
        return lo, hi

    # -- integer division --------------------------------------------------
    def _divmod(self, d: int) -> tuple[Expr, Expr]:
        """self = d * quotient + rest, pulling every multiple of d out of rest."""
        q_terms = {a: c // d for a, c in self.terms if c % d == 0}
        r_terms = {a: c for a, c in self.terms if c % d != 0}
        q_const, r_const = divmod(self.const, d)
        return Expr._make(q_terms, q_const), Expr._make(r_terms, r_const)

    def floordiv(self, d: int) -> Expr:
        if d == 1:
            return self
        quotient, rest = self._divmod(d)
        lo, hi = rest.bounds
        if lo < 0:  # only lanes masked off can be negative; keep the plain form
            return Expr.of(FloorDiv(self, d))
        if hi < d:
            return quotient
        return quotient + Expr.of(FloorDiv(rest, d))

    def mod(self, d: int) -> Expr:
        if d == 1:
            return Expr()
        _, rest = self._divmod(d)
        lo, hi = rest.bounds
        if lo < 0:
            return Expr.of(Mod(self, d))
        if hi < d:
            return rest
        return Expr.of(Mod(rest, d))

    # -- rendering --------------------------------------------------------
    def render(self, name: Callable[[Atom], str]) -> str:
        """Triton source; `name` spells atoms that are variables of the kernel."""
        parts = []
        for atom, c in self.terms:
            text = _render_atom(atom, name)
            parts.append(
                text if c == 1 else f"{size(c)}*{text}" if c > 0 else f"-{text}" if c == -1 else f"(-{size(-c)})*{text}"
            )
        if self.const or not parts:
            parts.append(size(self.const) if self.const >= 0 else f"-{size(-self.const)}")
        out = " + ".join(parts)
        return out.replace("+ -", "- ")


def _render_atom(atom: Atom, name: Callable[[Atom], str]) -> str:
    if isinstance(atom, FloorDiv):
        return f"({_paren(atom.expr, name)} // {size(atom.divisor)})"
    if isinstance(atom, Mod):
        return f"({_paren(atom.expr, name)} % {size(atom.divisor)})"
    return name(atom)


def _paren(expr: Expr, name) -> str:
    text = expr.render(name)
    return text if len(expr.terms) + bool(expr.const) <= 1 else f"({text})"


def const(value: int) -> Expr:
    return Expr((), value)


# -- the iteration space --------------------------------------------------------


def contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def row_padded_strides(shape, row: int) -> tuple[int, ...]:
    """Strides of `shape` laid out with each row (its last dim) `row` elements apart: the
    interior of a buffer padded along its last dim (plan/pad_matmuls.py)."""
    return (*[stride * row for stride in contiguous_strides(list(shape[:-1]))], 1)


class IterationSpace:
    """The dims a kernel walks, outermost first, and their index variables, defined from
    the flat index `base` (`offsets` in a pointwise kernel). A kernel with two spaces (a
    reduction's rows and reduced dims) numbers the second one's variables from `first`."""

    def __init__(self, shape, base: str = "offsets", first: int = 0):
        self.shape = tuple(shape)
        self.base = base
        self.first = first
        self.numel = 1
        for s in self.shape:
            self.numel *= s
        self.pitch = contiguous_strides(self.shape)  # P_k in the module docstring

    def var(self, dim: int) -> Expr:
        size = self.shape[dim]
        return const(0) if size == 1 else Expr.of(Var(self.first + dim, size))

    def owns(self, var: Var) -> bool:
        return self.first <= var.dim < self.first + len(self.shape)

    def definition(self, var: Var) -> str:
        """Triton source of `x{dim}` in terms of `offsets`."""
        dim = var.dim - self.first
        pitch = self.pitch[dim]
        outermost = all(s == 1 for s in self.shape[:dim])
        text = self.base if pitch == 1 else f"{self.base} // {size(pitch)}"
        if outermost:
            return text
        return f"{text} % {size(var.size)}" if pitch == 1 else f"({text}) % {size(var.size)}"

    def collapse(self, expr: Expr, apart: frozenset[int] = frozenset()) -> Expr:
        """Rewrite each run of adjacent variables whose coefficients are c * P_j / P_i
        (i the run's innermost dim) as c * Flat(P_i): a tensor laid out like the space
        over those dims. The innermost run of a contiguous tensor is `offsets` itself,
        which Triton vectorizes; a lone variable reads better as itself and is kept.
        Variables of `apart` (their `Var.dim`) join no run: a layout padded at some sizes
        and not at others reads alike at all of them."""
        coeff = {
            a.dim - self.first: c for a, c in expr.terms if isinstance(a, Var) and self.owns(a) and a.dim not in apart
        }
        live = [d for d, s in enumerate(self.shape) if s > 1]
        runs: list[list[int]] = []
        for d in reversed(live):  # innermost first
            run = runs[-1] if runs else []
            if (
                d in coeff
                and run
                and run[-1] == live[live.index(d) + 1]
                and coeff[d] == coeff[run[0]] * (self.pitch[d] // self.pitch[run[0]])
            ):
                run.append(d)
            elif d in coeff:
                runs.append([d])
        kept = dict(expr.terms)
        for run in runs:
            if len(run) < 2:
                continue
            inner, top = run[0], run[-1]
            for d in run:
                del kept[Var(self.first + d, self.shape[d])]
            flat = Flat(
                self.pitch[inner], self.pitch[top] * self.shape[top] // self.pitch[inner], top != live[0], self.base
            )
            kept[flat] = kept.get(flat, 0) + coeff[inner]
        return Expr._make(kept, expr.const)


def render_flat(atom: Flat) -> str:
    text = atom.base if atom.pitch == 1 else f"({atom.base} // {size(atom.pitch)})"
    return f"({text} % {size(atom.count)})" if atom.wraps else text


def decide(expr: Expr, relation: str, bound: int) -> bool | None:
    """`expr <relation> bound` (>=, < or ==) where the range of `expr` decides it, else None."""
    lo, hi = expr.bounds
    if relation == ">=":
        return True if lo >= bound else False if hi < bound else None
    if relation == "<":
        return True if hi < bound else False if lo >= bound else None
    return True if lo == hi == bound else False if not lo <= bound <= hi else None


def same_address(a: Expr, b: Expr, points: int = 1 << 16) -> bool:
    """Whether two offsets name the same element at every point of their variables' ranges: a
    3-D view's `1024*(x0 // 1024) + 1024*(x0 % 1024) + r0` and a 2-D tensor's `1024*x0 + r0`.
    Both are sums of variables, floors and remainders, so moving one variable by P (the lcm of
    the divisors of the floors and remainders it is inside; 1 in none) changes their difference
    by a constant: zero over [0, 2P) of each variable (or its whole range) is zero everywhere.
    False where that takes more than `points` points, or for an atom it cannot evaluate."""
    if a == b:
        return True
    found: dict[int, int] = {}
    divisors: dict[int, set[int]] = {}
    if not (_survey(a, found, divisors, ()) and _survey(b, found, divisors, ())):
        return False
    ranges = [(dim, range(min(size, 2 * math.lcm(*divisors.get(dim, {1}))))) for dim, size in sorted(found.items())]
    if math.prod(len(r) for _, r in ranges) > points:
        return False
    for values in itertools.product(*(r for _, r in ranges)):
        at = dict(zip((dim for dim, _ in ranges), values))
        if _value(a, at) != _value(b, at):
            return False
    return True


def _survey(expr: Expr, found: dict[int, int], divisors: dict[int, set[int]], outer: tuple[int, ...]) -> bool:
    """Collect `expr`'s variables (dim -> size) and, per variable, the divisors of the floors and
    remainders it is inside (`outer`: those around `expr`); False for an atom `_value` cannot take."""
    for atom, _ in expr.terms:
        if isinstance(atom, Var):
            found[atom.dim] = atom.size
            divisors.setdefault(atom.dim, {1}).update(outer)
        elif isinstance(atom, (FloorDiv, Mod)):
            if not _survey(atom.expr, found, divisors, (*outer, atom.divisor)):
                return False
        else:
            return False
    return True


def _value(expr: Expr, at: dict[int, int]) -> int:
    total = expr.const
    for atom, coeff in expr.terms:
        if isinstance(atom, Var):
            total += coeff * at[atom.dim]
        elif isinstance(atom, FloorDiv):
            total += coeff * (_value(atom.expr, at) // atom.divisor)
        else:
            total += coeff * (_value(atom.expr, at) % atom.divisor)
    return total
