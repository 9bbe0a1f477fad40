"""Kernel families: one compiled kernel for signatures that differ only in sizes.

A generated kernel spells every size it needs as an integer literal: RoPE's
cos in the [B, H, S, D] layout is read at `offsets % 262144` (S * D). Literals
are the fastest form (a constant divisor compiles to a multiply and a shift,
and lets Triton prove the contiguity behind 16-byte vector loads), but each
new sequence length would then be new Triton text, a new compile (~0.3 s).

So the first kernel of a given *skeleton* (its text with every integer literal
blanked out) keeps its literals. When a second kernel arrives with the same
skeleton and different literals, the positions that differ become runtime
arguments `s0, s1, ...` (positions that changed together share one), and
that one kernel text serves every later member: the module passes the member's
values after `n_elements`. A member is only served when its own literals
agree with the template everywhere else, so the shared kernel computes
exactly what the member's own text would: textual equality, no reasoning
about which literal means what. A member that differs somewhere new widens
the template once more.

This is Inductor's "automatic dynamic" (static first, dynamic once a size is
seen to change) done on generated text instead of symbolic shapes.
"""
from __future__ import annotations

import io
import threading
import tokenize
from dataclasses import dataclass, field, replace

from minicomp import logs
from minicomp.codegen.kernel import KernelSource


def int_literals(text: str) -> list[tuple[int, int]]:
    """Character spans of the decimal integer literals in Python source `text`."""
    line_starts = [0]
    for line in text.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NUMBER and tok.string.isdigit():
            (row, col), (end_row, end_col) = tok.start, tok.end
            spans.append((line_starts[row - 1] + col, line_starts[end_row - 1] + end_col))
    return spans


@dataclass
class Family:
    """Kernels with one skeleton; `groups` are the literal positions made runtime sizes."""
    first: tuple[int, ...]                       # the literals of the first member
    seen: list[tuple[int, ...]] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)

    def values(self, literals: tuple[int, ...]) -> list[int] | None:
        """The runtime sizes that make the template read as `literals`, or None if it cannot."""
        variable = {p for group in self.groups for p in group}
        if any(literals[p] != self.first[p] for p in range(len(literals)) if p not in variable):
            return None
        if any(len({literals[p] for p in group}) > 1 for group in self.groups):
            return None
        return [literals[group[0]] for group in self.groups]

    def widen(self, literals: tuple[int, ...]) -> None:
        """Make every position where some member differs from the first a runtime size;
        positions whose values agreed in every member share one."""
        self.seen.append(literals)
        columns: dict[tuple[int, ...], list[int]] = {}
        for p in range(len(self.first)):
            column = tuple(member[p] for member in [self.first] + self.seen)
            if len(set(column)) > 1:
                columns.setdefault(column, []).append(p)
        self.groups = list(columns.values())


_families: dict[tuple, Family] = {}
_lock = threading.Lock()


def generalize(source: KernelSource) -> KernelSource:
    """`source` as the member of its family it is: unchanged for the first member,
    else the family's template, with this member's values for its runtime sizes."""
    text = "\n".join(source.body)
    spans = int_literals(text)
    literals = tuple(int(text[a:b]) for a, b in spans)
    between = [text[:spans[0][0]] if spans else text]   # the skeleton: the text around the literals
    for (_, end), (nxt, _) in zip(spans, spans[1:] + [(len(text), None)]):
        between.append(text[end:nxt])
    key = (source.name, source.wide_index, tuple(between))
    with _lock:
        family = _families.setdefault(key, Family(literals))
        if literals == family.first:  # the first member keeps its constants
            return source
        values = family.values(literals)
        if values is None:
            family.widen(literals)
            values = family.values(literals)
            logs.recompiles.info("%s: sizes at %d literal positions become runtime arguments",
                                 source.name, sum(map(len, family.groups)))
        groups = family.groups
    names = [f"s{i}" for i in range(len(groups))]
    name_at = {p: names[i] for i, group in enumerate(groups) for p in group}
    pieces = [between[0]]
    for p, (a, b) in enumerate(spans):
        pieces += [name_at.get(p, text[a:b]), between[p + 1]]
    sizes = ", ".join(f"{n} = {v}" for n, v in zip(names, values))
    return replace(source, body="".join(pieces).split("\n"), sizes=names, size_values=values,
                   header=source.header + [f"  runtime sizes: {sizes} (a kernel family, codegen/families.py)"])


def forget() -> None:
    """Drop every family (tests start from a clean slate)."""
    with _lock:
        _families.clear()
