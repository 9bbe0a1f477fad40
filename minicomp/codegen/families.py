"""Kernel families: one compiled kernel for signatures that differ only in sizes.

A generated kernel spells every size it needs as an integer literal: RoPE's
cos in the [B, H, S, D] layout is read at `offsets % 262144` (S * D). Literals
are the fastest form (a constant divisor compiles to a multiply and a shift,
and lets Triton prove the contiguity behind 16-byte vector loads), but each
new sequence length would then be new Triton text, a new compile.

So the first kernel of a given *skeleton* (its text with every size blanked
out) keeps its literals. Only sizes can vary: the writer marks each integer that
an index rendered (`«64»`, indexing.py); a literal that is a value (`x + 3` on
an int8 tensor, where a runtime int32 would change the arithmetic) or that
Triton needs as a constant is part of the skeleton. When a second kernel arrives with the same
skeleton and different literals, the positions that differ become runtime
arguments `s0, s1, ...` (positions that changed together share one), and
that one kernel text serves every later member: the module passes the member's
values after `n_elements`. A member is only served when its own literals
agree with the template everywhere else, so the shared kernel computes
exactly what the member's own text would: textual equality, no reasoning
about which literal means what. A member that differs somewhere new widens
the template once more. The runtime sizes are `do_not_specialize`: Triton would
otherwise compile a binary per class of each size's value (== 1, a multiple of
16: B * S at S = 504 after 500-503), and the binary without those assumptions
runs as fast (RoPE at S = 2048 after 1024 and 1531, bf16, H200: 131.9 against
131.8 us specialized).

A family's launches pass their element (or row) count too, which Triton also specializes on
(== 1, a multiple of 16, neither). Its binaries are per text (the first member's, the template's):
a member whose count's class a specialized binary of its text already serves keeps that text.
Where a member would compile anyway, the count is `do_not_specialize` when that text has served
another class, the family's counts fall in two classes, or they share no factor of 16 (Llama's
4 * S norm rows at S = 1023 and at its probe 1007); that loosened text then serves every class no
specialized binary serves (S = 1016, 1008), where each would have compiled a binary. A count that
carries a factor of 16 throughout (B * S * 2048 elements) stays specialized: a pointwise kernel's
masked loads keep their 16-byte vectors.

The same function traced again (Dynamo's dynamic graph after its static one) names
its values anew (`add_6` for `add`): its kernels are then compared up to the names
of their locals too (parameters and the temporaries their lines assign: `alpha_key`,
alike.py's renaming), and such a member is served the first member's text, its
arguments passed in the same order. A kind whose launch fields name its parameters (a
matmul template's operand pointers) is compared by its text as written.

This is Inductor's "automatic dynamic" (static first, dynamic once a size is
seen to change) done on generated text instead of symbolic shapes. A dynamic graph
is written once at a probe size before its first size (capture/specialize.py
`probe_args`), so the families it starts have their second member before any is compiled. The families
belong to whoever compiles: each `minicomp.jit` function has its own
(`Families`), and through `torch.compile` so has each function Dynamo traces
(dispatch/frame_families.py), so what one function saw never changes another's code.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace

from minicomp import logs
from minicomp.codegen import alike
from minicomp.codegen.assigned import Outside
from minicomp.codegen.kernel import KernelSource
from minicomp.lowering.indexing import SIZE, resolve_sizes
from minicomp.runtime.records import int_class


def size_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the marked sizes in `text` (marks included)."""
    return [m.span() for m in SIZE.finditer(text)]


@dataclass
class Family:
    """Kernels with one skeleton; `groups` are the literal positions made runtime sizes."""

    first: tuple[int, ...]  # the literals of the first member
    between: list[str] = field(default_factory=list)  # the first member's text around its sizes, in its names
    params: list[str] = field(default_factory=list)  # and its pointer parameters
    renamable: bool = False  # its kind's text may serve a member that names its locals otherwise
    seen: list[tuple[int, ...]] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)
    probed: bool = False  # its first member was written at a probe size, never compiled
    # its members' element (or row) counts, kept as what loose_count asks of them (O(1) a member)
    first_count: int | None = None
    counts_vary: bool = False
    counts_gcd: int = 0
    count_classes: set[str] = field(default_factory=set)
    # a text (None: the first member's; else the template's groups) -> the count classes its
    # specialized form was compiled for; and the texts whose count is loosened (loose_count)
    served: dict[tuple | None, set[str]] = field(default_factory=dict)
    loose: set[tuple | None] = field(default_factory=set)

    def loose_count(self, source: KernelSource, text: tuple | None, probe: bool) -> list[str]:
        """[the count's parameter] where Triton must not specialize on it, else []. Binaries are
        per text: `text` names the one this member is served (None: the first member's; else the
        template's groups). A member whose class the text's specialized form was compiled for
        keeps that form. Else (a compile either way) the count is loosened: where the text is
        loosened already, where its specialized form served another class, or where the counts
        share no factor of 16 or fall in two classes. A probe (never compiled) records nothing."""
        n, cls = source.numel, int_class(source.numel)
        self.first_count = n if self.first_count is None else self.first_count
        self.counts_vary |= n != self.first_count
        self.counts_gcd = math.gcd(self.counts_gcd, n)
        self.count_classes.add(cls)
        if source.numel_param is None:
            return []
        served = self.served.setdefault(text, set())
        if cls in served:  # its specialized binary exists (and keeps Triton's divisibility)
            return []
        if text in self.loose:
            return [source.numel_param]
        if served or len(self.count_classes) > 1 or (self.counts_vary and self.counts_gcd % 16):
            if not probe:
                self.loose.add(text)
            return [source.numel_param]
        if not probe:
            served.add(cls)
        return []

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


class Families:
    """The kernel families of one compiling function (jit function, Dynamo graph).

    Kernels are found by their text around their sizes as written. Once `match_renamed` is set
    (a function traced again: dispatch/frame_families.py), a kernel that misses is looked up by
    `alpha_key` too, and found, it joins that family under its own text as well; the first
    trace pays nothing for it (alpha_key parses each kernel)."""

    def __init__(self):
        self._families: dict[tuple, Family] = {}  # (name, wide index, text around the sizes) -> family
        self._renamed: dict[tuple, Family] = {}  # (name, wide index, alpha_key) -> family
        self._keyed: set[int] = set()  # ids of the families in `_renamed`
        self._blanks: dict[int, tuple] = {}  # id of a family -> its `_blank`
        self._keyed_blanks: set[tuple] = set()  # (name, wide index, `_blank`) of the families in `_renamed`
        self.match_renamed = False
        self._lock = threading.Lock()
        self.checked: dict[str, Outside] = {}  # a kernel's functions -> what they read from the module (assigned.py)

    def _find(self, source: KernelSource, between: list[str]) -> Family | None:
        """The family of a kernel whose text around its sizes is `between` (lock held)."""
        exact = _exact(source, between)
        family = self._families.get(exact)
        if family is not None or not self.match_renamed:
            return family
        blank = _blank(source, between)  # (a renamed kernel's text differs only in its identifiers)
        for (name, wide, _), known in list(self._families.items()):  # the families not yet keyed so
            if id(known) not in self._keyed and (name, wide) == (source.name, source.wide_index):
                if id(known) not in self._blanks:
                    self._blanks[id(known)] = _blank(known, known.between)
                if self._blanks[id(known)] != blank:
                    continue
                self._keyed.add(id(known))
                renamed = alpha_key(known.params, known.between) if known.renamable else None
                if renamed is not None:
                    self._renamed.setdefault((name, wide, renamed), known)
                    self._keyed_blanks.add((name, wide, blank))
        if (source.name, source.wide_index, blank) not in self._keyed_blanks:
            return None  # (no family it could be a renaming of: none is keyed, none parses)
        renamed = alpha_key(source.params, between) if source.renamable else None
        family = None if renamed is None else self._renamed.get((source.name, source.wide_index, renamed))
        if family is not None:
            self._families[exact] = family  # this naming's next member finds it by its text
        return family

    def generalize(self, source: KernelSource, probe: bool = False) -> KernelSource:
        """`source` as the member of its family it is, sizes written out: unchanged for the first
        member, else the family's template, with this member's values for its runtime sizes.
        `probe`: a kernel written at a probe size (capture/specialize.py), never compiled: a
        family it starts serves a later member at those sizes its template, once it has one (the
        first member's own text would be another Triton compile)."""
        text = "\n".join(source.body)
        spans = size_spans(text)
        literals = tuple(int(text[a + 1 : b - 1]) for a, b in spans)  # inside the marks
        between = [text[: spans[0][0]] if spans else text]  # the skeleton: the text around the sizes
        for (_, end), (nxt, _) in zip(spans, spans[1:] + [(len(text), None)]):
            between.append(text[end:nxt])
        with self._lock:
            family = self._find(source, between)
            if family is None:
                family = Family(literals, between, list(source.params), source.renamable, probed=probe)
                self._families[_exact(source, between)] = family
            if literals == family.first and not (family.probed and family.groups):
                # the first member keeps its constants (and its names); a probe's was never compiled
                loose = family.loose_count(source, None, probe)
                if between == family.between and source.params == family.params:
                    return _loosened(resolved(source), loose)
                text = "".join(p for pair in zip(family.between, [*map(str, literals), ""]) for p in pair)
                return _loosened(replace(source, params=family.params, body=text.split("\n")), loose)
            values = family.values(literals)
            if values is None:
                family.widen(literals)
                values = family.values(literals)
                logs.recompiles.info(
                    "%s: sizes at %d literal positions become runtime arguments",
                    source.name,
                    sum(map(len, family.groups)),
                )
            groups = family.groups
            loose = family.loose_count(source, tuple(map(tuple, family.groups)), probe)
        names = [f"s{i}" for i in range(len(groups))]
        name_at = {p: names[i] for i, group in enumerate(groups) for p in group}
        pieces = [family.between[0]]
        for p, literal in enumerate(literals):
            pieces += [name_at.get(p, str(literal)), family.between[p + 1]]
        sizes = ", ".join(f"{n} = {v}" for n, v in zip(names, values))
        member = replace(
            source,
            params=family.params,
            body="".join(pieces).split("\n"),
            sizes=names,
            size_values=values,
            unspecialized=names,  # one binary for every value: Triton would compile one per class
            header=source.header + [f"  runtime sizes: {sizes} (a kernel family, codegen/families.py)"],
        )
        return _loosened(member, loose)


def _loosened(source: KernelSource, loose: list[str]) -> KernelSource:
    """`source` with its count (`loose`: [its parameter] or []) not specialized on either."""
    if not loose:
        return source
    note = f"  {loose[0]}: not specialized (a kernel family's counts, codegen/families.py)"
    return replace(source, unspecialized=source.unspecialized + loose, header=source.header + [note])


def alpha_key(params: list[str], between: list[str]) -> str | None:
    """A kernel's text around its sizes (`between`, its pointer parameters `params`) up to a
    one-to-one renaming of its locals (the parameters, the names its lines assign), as alike.py
    compares kernels: equal for two kernels exactly when one is the other renamed, so one's text
    computes what the other's would, given its arguments in the same order. Names its lines only
    read (`tl`, the template's `offsets`, helpers such as `_sum`) stay as written. None for a
    body that does not parse."""
    lines = "0".join(between).split("\n")  # (each size as 0: the skeleton)
    function = f"def _kernel({', '.join(params)}):\n" + "\n".join("    " + line for line in lines)
    return alike.renamed_digest(function)


def _blank(kernel: KernelSource | Family, between: list[str]) -> tuple:
    """A kernel's parameter count and text around its sizes with every identifier as `_`: equal for
    two kernels whose `alpha_key`s are (one is the other renamed), so a kernel whose blank no family
    shares is keyed by no parse."""
    return len(kernel.params), tuple(alike.blanked(part) for part in between)


def resolved(source: KernelSource) -> KernelSource:
    """`source` with its sizes written as plain literals (a kernel outside any family)."""
    return replace(source, body=[resolve_sizes(line) for line in source.body])


def _exact(source: KernelSource, between: list[str]) -> tuple:
    """A family's key: the kernel's name, index width and text around its sizes; for a kind whose
    template names its parameters outside the body (a matmul's `a_pointer`), its parameters too: a
    member can take no other names (a backward's `mm` of the tangents is not the forward's `mm`
    of another value, though their epilogues read alike)."""
    skeleton = tuple(between) if source.renamable else (tuple(between), tuple(source.params))
    return (source.name, source.wide_index, skeleton)
