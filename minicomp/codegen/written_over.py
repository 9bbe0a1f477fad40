"""Which buffers a reduction kernel's element store may write over (`ReductionSource.aligned`,
which codegen/reuse.py reads to put a result in a donated or dying input's memory).

A reduction kernel walks each of its rows in passes (codegen/reduction.py `Phase`): row values
(a gather of the target's logit) before a pass, the loop body, what follows it. A store in pass k
may write over buffer b when every load of b is either of the store's own element, in pass k or
an earlier one, or of another element of the store's own row, in an earlier pass or before pass
k's loop, and none comes later. A row belongs to one program, so no other program reads what
this one writes; a program's loads of its row before the writing pass read what was there.
"""

from __future__ import annotations

from minicomp.lowering.indexing import Dyn, Expr, Var, same_address


def written_over(
    stored: Expr, k: int, sites: list[tuple[str, Expr, int, str]], loaded: dict[str, set], rows: int
) -> tuple[str, ...]:
    """The buffers a store at offset `stored` in pass `k` may write over. `sites`: each load's
    (buffer, offset, pass, "before" or "body"; pass -1: outside the passes); `loaded`: each buffer's
    offsets (None: a broadcast); `rows`: the number of row dims (the index variables below it)."""
    by_buffer: dict[str, list] = {}
    for buffer, offset, here, where in sites:
        by_buffer.setdefault(buffer, []).append((offset, here, where))

    def fits(offset: Expr, here: int, where: str) -> bool:
        if here < 0 or here > k:
            return False
        if same_address(offset, stored):
            return True
        return (here < k or where == "before") and same_row(offset, stored, rows)

    return tuple(
        b
        for b, offsets in loaded.items()
        if offsets
        and None not in offsets
        and offsets <= {site[0] for site in by_buffer.get(b, [])}
        and all(fits(*site) for site in by_buffer.get(b, []))
    )


def same_row(loaded: Expr, stored: Expr, rows: int) -> bool:
    """Whether offset `loaded` is an element of the row that offset `stored` walks (a reduction over
    one dim, at stride `step`): the same row terms and constant, and one more term, the reduced
    variable or a run-time index (a gather's `Dyn`, masked to its size) at that stride, within the
    row's length."""
    row_terms = [(a, c) for a, c in stored.terms if not _reduced(a, rows)]
    reduced = [(a, c) for a, c in stored.terms if _reduced(a, rows)]
    if len(reduced) != 1 or not isinstance(reduced[0][0], Var) or loaded.const != stored.const:
        return False
    (var, step), rest = reduced[0], [(a, c) for a, c in loaded.terms if (a, c) not in row_terms]
    if len(rest) != 1 or len(loaded.terms) != len(row_terms) + 1:
        return False
    ((atom, c),) = rest
    return c == step and isinstance(atom, (Var, Dyn)) and _reduced(atom, rows) and atom.size <= var.size


def _reduced(atom, rows: int) -> bool:
    """Whether an atom is a reduced variable (or a run-time index into the reduced dims)."""
    return isinstance(atom, Dyn) or isinstance(atom, Var) and atom.dim >= rows
