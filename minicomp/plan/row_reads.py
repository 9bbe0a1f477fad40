"""Where a reduction kernel reads its own reductions: a fusion rule of fusion.py.

A reduction kernel holds each reduction's result as a row tile `[XBLOCK, 1]`: the value of the
row the program is reducing (codegen/reduction.py). A consumer that reads the result at another
row (transposed, flipped, gathered: `x * s + s.t()` with `s = x.sum(1, keepdim=True)`) cannot
be computed there. `misreads` finds such reads before codegen, by evaluating the kernel the way
its writer will, through the same lowering rules, with a `Writer` that writes nothing; fusion.py
then cuts the edge where the path to that read first leaves its own place (the reduction and
`permute`, or `permute` and its reader `add`), so the value on the far side is written by its
kernel and its reader reads it from memory in a later one.

An index into a dim of extent 1 is the row's whatever it says: such a read is in bounds only
where it is 0, and masked off elsewhere (a load's offset drops those dims too), so Mamba2's
row sum scattered into the last column of its row (`slice_scatter(zeros, s, -1, -1)`, read at
`r0 - 7` under `r0 >= 7`) is read at its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.ir import Graph
from minicomp.lowering import ops
from minicomp.lowering.indexing import Dyn, Expr, FloorDiv, IterationSpace, Mod, Var, const, decide, render_flat
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.reductions import spec
from minicomp.plan.steps import ReductionKernel


def row_index(kernel: ReductionKernel, full_index: tuple[Expr, ...], shape) -> tuple[Expr, ...]:
    """Where a value of `shape` (the space, or its rows) is evaluated in reduction `kernel`, whose
    space is evaluated at `full_index`."""
    full = kernel.shape
    if tuple(shape) == tuple(full):
        return full_index
    # the rows, with dims of size 1 kept, added or dropped: the sized dims are the rows', in order
    # (a [6, 1] value in a kernel over [1, 6] reduced over dim 0 is at [x0, 0], not [0, x0])
    rows = [e for d, e in enumerate(full_index) if d not in kernel.reduced and full[d] != 1]
    if sum(1 for s in shape if s != 1) != len(rows):
        raise NotImplementedError(
            f"a value of shape {list(shape)} has no place in a reduction kernel over {list(full)}"
        )
    rows = iter(rows)
    return tuple(const(0) if s == 1 else next(rows) for s in shape)


def at_row(index: tuple[Expr, ...], row: tuple[Expr, ...], shape) -> bool:
    """Whether a reduction's result of `shape`, read at `index`, is read at its `row`: dims of
    extent 1 are 0 wherever the read is in bounds."""
    return len(index) == len(row) and all(n == 1 or a == b for a, b, n in zip(index, row, shape))


def has_r(expr: Expr, first_r: int) -> bool:
    """Whether `expr` varies along a reduction kernel's row (its `r` variables, numbered from `first_r`)."""
    return any(_atom_has(atom, lambda v: v.dim >= first_r, "rindex") for atom, _ in expr.terms)


def has_x(expr: Expr, first_r: int) -> bool:
    """Whether `expr` varies with a reduction kernel's row number (its `x` variables)."""
    return any(_atom_has(atom, lambda v: v.dim < first_r, "xindex") for atom, _ in expr.terms)


def _atom_has(atom, test, base: str) -> bool:
    if isinstance(atom, Var):
        return test(atom)
    if isinstance(atom, (FloorDiv, Mod)):
        return any(_atom_has(a, test, base) for a, _ in atom.expr.terms)
    if isinstance(atom, Dyn):
        return atom.full if base == "rindex" else True
    return getattr(atom, "base", None) == base


def misreads(graph: Graph, kernel: ReductionKernel, kinds) -> list[Misread]:
    """Each read of one of `kernel`'s reductions at another row than the one it reduces, with the
    edge to cut: where the path from a value at its own place (a store, a reduction's operand)
    first leaves it (CLIP's loss adds a gradient to the transpose of one computed from a row sum:
    the transposed gradient is written whole, rather than the sum read back to compute it again)."""
    return list(_Probe(graph, kernel, kinds).walk().values())


@dataclass(frozen=True)
class Misread:
    """`reader`, a value at its own place in the kernel, reads `value` at `at`, another place,
    where `value` reads `reduction` at another row (`value` may be the reduction itself)."""

    value: str
    reader: str
    at: str
    reduction: str
    row: str

    def __str__(self) -> str:
        text = f"{self.reader} reads {self.value} at {self.at}"
        if self.value != self.reduction:
            text += f", which reads {self.reduction} at {self.row}"
        return f"{text}, another row than the one it reduces: {self.value} is written and read back"


class _Probe:
    """A lowering `Writer` (ops/core.py) that writes no text: it evaluates a reduction kernel's
    operands and stores at the indexes codegen/reduction.py evaluates them at."""

    def __init__(self, graph: Graph, kernel: ReductionKernel, kinds):
        self.graph, self.kernel, self.kinds = graph, kernel, kinds
        shape, reduced = kernel.shape, kernel.reduced
        rows = [d for d in range(len(shape)) if d not in reduced]
        self.first_r = len(rows)
        self.row_sizes = tuple(shape[d] for d in rows if shape[d] != 1)
        xspace = IterationSpace([shape[d] for d in rows], base="xindex")
        rspace = IterationSpace([shape[d] for d in reduced], base="rindex", first=len(rows))
        x, r = iter(range(len(rows))), iter(range(len(reduced)))
        self.full_index = tuple(rspace.var(next(r)) if d in reduced else xspace.var(next(x)) for d in range(len(shape)))
        self.loads = set(kernel.loads)
        self.memo: dict[tuple, ops.Value] = {}
        self.reader = ""  # the node whose rule is being evaluated
        self.edge: tuple[str, str, str] | None = None  # (value, reader, at) where this path left its place
        self.found: dict[tuple[str, str], Misread] = {}

    def walk(self) -> dict[tuple[str, str], Misread]:
        for name in self.kernel.nodes:
            if self.kinds[name] is NodeKind.REDUCTION:
                grouped = name in self.graph.grouped
                source = self.graph.grouped_source(name) if grouped else spec(self.graph[name], self.graph).source
                self._read(name, source, self.full_index)
        for name in self.kernel.stores:
            if name not in self.kernel.grouped:
                self._read(name, name, row_index(self.kernel, self.full_index, self.graph[name].meta.shape))
        return self.found

    def _read(self, reader: str, name: str, index) -> None:
        self.reader, self.edge = reader, None
        self.value(name, index, ())

    def _home(self, shape) -> tuple[Expr, ...] | None:
        """Where a value of `shape` is at its own place in this kernel; None if it has none."""
        if tuple(shape) == tuple(self.kernel.shape):
            return self.full_index
        if tuple(s for s in shape if s != 1) == self.row_sizes:
            return row_index(self.kernel, self.full_index, shape)
        return None

    def _text(self, index) -> str:
        return "[" + ", ".join(self.index_text(e) for e in index).replace("«", "").replace("»", "") + "]"

    # -- the Writer protocol -------------------------------------------------------
    tile = "[XBLOCK, RBLOCK]"

    def is_full(self, index) -> bool:
        return any(has_r(e, self.first_r) for e in index)

    def tile_for(self, index) -> str:
        return self.tile if self.is_full(index) else "[XBLOCK, 1]"

    def index_text(self, expr: Expr) -> str:
        return expr.render(self._atom_text)

    def load_mask(self, index, mask) -> str:
        return " & ".join(("xmask",) + tuple(mask))

    def temp(self, code: str, dtype: torch.dtype, hint: str, comment: str = "", plain_load: bool = False) -> ops.Value:
        return ops.Value(hint, dtype)

    def compare(self, expr: Expr, relation: str, bound: int) -> str | bool:
        """Decided where codegen's writer decides it (the range of `expr`), else undecided."""
        decided = decide(expr, relation, bound)
        return decided if decided is not None else f"({self.index_text(expr)} {relation} {bound})"

    def divides(self, expr: Expr, step: int) -> str | bool:
        rest = expr.mod(step)
        return rest.const == 0 if rest.is_const else f"(({self.index_text(expr)}) % {step} == 0)"

    def value(self, name: str, index, mask=()) -> ops.Value:
        key = (name, index, mask)
        if key not in self.memo:
            self.memo[key] = self._evaluate(name, index, mask)
        return self.memo[key]

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        node = self.graph[name]
        value = ops.Value(name, node.meta.dtype)
        if name in self.loads or self.kinds[name] is NodeKind.INPUT:
            return value
        home = self._home(node.meta.shape)
        away = home is not None and not at_row(index, home, node.meta.shape)
        if self.kinds[name] is NodeKind.REDUCTION:
            if away:
                value_, reader, at = self.edge or (name, self.reader, self._text(index))
                self.found.setdefault((value_, reader), Misread(value_, reader, at, name, self._text(index)))
            return value
        outer = self.reader, self.edge
        if home is not None:  # at its place, nothing below is cut above it; away, the first edge away is
            self.edge = (self.edge or (name, self.reader, self._text(index))) if away else None
        self.reader = name
        try:
            op = ops.Op(node, self.graph, self, index, mask)
            if node.op_name in ops.VIEWS:
                source, source_index = ops.VIEWS[node.op_name](op, index)
                self.value(source, source_index, mask)
            else:
                (ops.INDEXED.get(node.op_name) or ops.POINTWISE[node.op_name])(op)
            return ops.Value(name, op.compute)
        finally:
            self.reader, self.edge = outer

    def _atom_text(self, atom) -> str:
        """The variable's name as the kernel's text gives it (r0 is the row's first reduced dim)."""
        if isinstance(atom, Var):
            return f"r{atom.dim - self.first_r}" if atom.dim >= self.first_r else f"x{atom.dim}"
        if isinstance(atom, Dyn):
            return atom.code
        return render_flat(atom)
