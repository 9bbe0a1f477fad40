"""Kernels of kind "reduction": rows of a space reduced over some of its dims, in a 2-D tile.

The space is the reduced value's shape S; its reduced dims D (`Kernel.reduced`)
are walked by the `r` variables along the tile's second axis, every other dim
(the rows) by the `x` variables along its first:

    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]    # [XBLOCK, 1]: rows
    rindex = roffset + tl.arange(0, RBLOCK)[None, :]         # [1, RBLOCK]: reduced elements

A value evaluated at an index with `r` variables is a *full* tile
[XBLOCK, RBLOCK]; one without (a reduction's result, the normalizing factor
computed from it, a load of a per-row target) is a *row* tile [XBLOCK, 1],
which broadcasts back over the row. The lowering rules are the pointwise
kernel's; only the tile differs.

Two forms, chosen by the plan from the reduced extent R (`reduction_space.reduction_form`):

* persistent: RBLOCK >= R, the whole row in registers. Everything is written
  straight down, so a norm reads `x` once and keeps it for the normalize.
* looped: rows over config "persistent_rows" elements or "persistent_bytes" bytes of
  their widest input (a norm over 4096 bf16, a 32k-128k vocabulary) are walked RBLOCK
  at a time; a pass that loads an address a later pass loads again keeps it in L2
  (`eviction`). Reductions are computed in *phases*, a loop over the row each
  (which one computes what: codegen/reduction_passes.py; add + RMSNorm writes
  `h` in its only reduction loop). Each reduction keeps an elementwise
  accumulator [XBLOCK, RBLOCK] and reduces it along the row after its loop, as
  Inductor does; a sum accumulated online with its max keeps a running sum a
  row, rescaled whenever the running max grows.

Reductions accumulate in float32 for 16-bit floats and int64 for integer sums,
as eager does (ops/reductions.py), and combine through the module's
@triton.jit helpers (`_sum`, `_max_nan`, ...: templates/combine.py.j2). The lines
that compute each reduction: codegen/reduction_lines.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from minicomp import config
from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.codegen.reduction_lines import ReductionLines
from minicomp.codegen.reduction_passes import passes
from minicomp.codegen.written_over import written_over
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, IterationSpace, Var, same_address, size
from minicomp.lowering.ops import NodeKind
from minicomp.plan.fusion import Kernel, Plan
from minicomp.plan.row_reads import at_row, row_index
from minicomp.plan.row_reads import has_r as _has_r
from minicomp.plan.row_reads import has_x as _has_x
from minicomp.runtime.launch_spec import ReductionLaunch


@dataclass(kw_only=True)
class ReductionSource(KernelSource):
    """A reduction kernel's text and its launch fields; `numel` counts its rows."""

    kind: ClassVar[str] = "reduction"
    template: ClassVar[str] = "reduction.py.j2"
    numel_param: ClassVar[str] = "n_rows"

    rblock: int  # RBLOCK: the elements of a row each program holds
    extent: int  # the row length: elements each row reduces
    groups: int = 0  # a grouped kernel's programs, one a row group (ReductionKernel.group)
    # row store -> buffers read at its own address and nowhere else: each program reads them for its
    # rows in its passes and stores the row after the last one, so the store may go into such a
    # buffer (a mutated input's new value, reuse.py `written_in_place`: batch norm's running statistics).
    # Also the last pass's element store where it is that pass's only one: each element is stored
    # after every load of it (a softmax's gradient over the logits it reads: reuse.py `reused_in_place`)
    aligned: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def launch_spec(self) -> ReductionLaunch:
        return ReductionLaunch(rows=self.numel, rblock=self.rblock, extent=self.extent, groups=self.groups)


def write(plan: Plan, kernel: Kernel) -> ReductionSource:
    """The kernel's source; a looped kernel is written twice where an address is loaded by more
    than one of its passes, the first time to learn which passes load each address
    (`ReductionWriter.eviction`; an address one pass loads is written alike either way)."""
    first = ReductionWriter(plan, kernel)
    source = first.write()
    if not kernel.looped or all(len(passes) < 2 for passes in first.passes.values()):
        return source
    return ReductionWriter(plan, kernel, first.passes).write()


@dataclass
class Phase:
    """One pass over the row: its reductions and full-space stores, and the row values
    computed before it (`before`), the loop body (`body`) and what follows the loop (`after`)."""

    reductions: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


class ReductionWriter(ReductionLines, KernelWriter):
    reserved = ("xindex", "xmask", "xstart", "xoffset", "rindex", "rmask", "roffset", "pid", "RBLOCK")
    tile = "[XBLOCK, RBLOCK]"

    def __init__(self, plan: Plan, kernel: Kernel, survey: dict | None = None):
        shape, reduced = kernel.shape, kernel.reduced
        self.rows = [d for d in range(len(shape)) if d not in reduced]
        self.xspace = IterationSpace([shape[d] for d in self.rows], base="xindex")
        self.rspace = IterationSpace([shape[d] for d in reduced], base="rindex", first=len(self.rows))
        self.extent = self.rspace.numel
        self.looped, self.rblock = kernel.looped, kernel.rblock
        super().__init__(plan, kernel, self.xspace)
        self.full_index = tuple(self._full_index())
        self.phase: Phase | None = None
        self.phases: list[Phase] = []
        self.results: dict[str, ops.Value] = {}  # reduction node -> its row value, once computed
        self.online: dict[str, str] = {}  # sum node -> the max node it is accumulated with
        self.full_memo: dict[tuple, ops.Value] = {}  # full values; a looped kernel's are per pass
        self.full = False  # whether the value being evaluated is a full tile
        self.prologue: list[str] = []  # a grouped kernel's lines before its loop over its rows ...
        self.epilogue: list[str] = []  # ... and after it (`Kernel.group`)
        self.hoisting = False  # a load that goes to the prologue is being written
        self.full_names: set[str] = set()  # the lines written in a loop body (full values)
        self.passes: dict[tuple[str, Expr], set[int]] = {}  # (buffer, offset) -> the passes that load it
        self.pass_survey = survey  # ... as an earlier writing of this kernel found them
        self.loading: tuple[str, Expr] | None = None  # the load being written: (buffer, offset)
        self.load_sites: list[tuple[str, Expr, int, str]] = []  # (buffer, offset, pass, "before"/"body")

    # -- the index -----------------------------------------------------------
    def _full_index(self):
        x = iter(range(len(self.rows)))
        r = iter(range(len(self.kernel.reduced)))
        for d in range(len(self.kernel.shape)):
            yield self.rspace.var(next(r)) if d in self.kernel.reduced else self.xspace.var(next(x))

    def index_of(self, shape: tuple[int, ...]) -> tuple[Expr, ...]:
        """Where a value of `shape` (the space, or its rows) is evaluated in this kernel."""
        return row_index(self.kernel, self.full_index, shape)

    def is_full(self, index) -> bool:
        return any(_has_r(e, len(self.rows)) for e in index)

    def tile_for(self, index) -> str:
        return self.tile if self.is_full(index) else "[XBLOCK, 1]"

    def atom_name(self, atom) -> str:
        if isinstance(atom, Var) and atom.dim >= len(self.rows):
            self.vars.add(atom)
            return f"r{atom.dim - len(self.rows)}"
        return super().atom_name(atom)

    def address(self, expr: Expr) -> str:
        return self.rspace.collapse(self.xspace.collapse(expr)).render(self.atom_name)

    @property
    def root_mask(self) -> str:
        return "xmask"

    def load_mask(self, index, mask) -> str:
        has_x = any(_has_x(e, len(self.rows)) for e in index)
        parts = (["xmask"] if has_x or not self.is_full(index) else []) + (["rmask"] if self.is_full(index) else [])
        return " & ".join(parts + list(mask))

    # -- values: row values before the loop, full values inside it ----------------
    def value(self, name: str, index, mask=()) -> ops.Value:
        full = self.is_full(index)
        memo = self.full_memo if full else self.memo
        key = (name, index, mask)
        if key not in memo:
            outer, self.full = self.full, full
            try:
                memo[key] = self._evaluate(name, index, mask)
            finally:
                self.full = outer
        return memo[key]

    def load(self, name: str, index, mask) -> ops.Value:
        """A grouped kernel reads what does not depend on the row (a norm's weight) once, before
        its loop over its rows."""
        hoist = self.kernel.group and not mask and not any(_has_x(e, len(self.rows)) for e in index)
        self.hoisting, outer = bool(hoist), self.hoisting
        self.loading = (name, self.offset_of(name, index))  # (where its line goes: `temp`)
        try:
            return super().load(name, index, mask)
        finally:
            self.hoisting, self.loading = outer, None

    def eviction(self, name: str, offset: Expr, index) -> str | None:
        """Inductor's L2 policy for a looped kernel's loads of the row: an address a later pass
        loads again is kept (evict_last) and let go at its last load (evict_first); so is a value
        every row reads, a norm's weight (benchmarks/experiments/reduction_variants.py).
        Records the load's pass too, for the writing after this one (`write`)."""
        if not self.looped or self.hoisting or not self.is_full(index):
            return None
        here = self.phases.index(self.phase)
        self.passes.setdefault((name, offset), set()).add(here)
        passes = (self.pass_survey or {}).get((name, offset), {here})
        if not _has_x(offset, len(self.rows)):
            return "evict_last"
        if max(passes) > here:
            return "evict_last"
        return "evict_first" if min(passes) < here else None

    def temp(self, code, dtype, hint, comment="", plain_load=False) -> ops.Value:
        """A line in the loop body (a full value) or before the loop (a row value). Which one the
        line's own reads decide, not the value being evaluated: a slice_scatter over the rows,
        evaluated at a full index, tests a row condition that masks the load of a `src` read at
        its rows (broadcast over the row); the condition goes before the loop with that load."""
        full = self._reads_full(code)
        lines = self.prologue if self.hoisting else self.phase.body if full else self.phase.before
        if self.loading is not None:  # (where a load's line goes: written_over.py)
            here = -1 if self.hoisting or self.phase not in self.phases else self.phases.index(self.phase)
            self.load_sites.append((*self.loading, here, "body" if full else "before"))
        key = (code, dtype, full)
        if key not in self.emitted:
            name = self.fresh(hint)
            lines.append(f"{name} = {code}" + (f"  # {comment}" if comment else ""))
            self.emitted[key] = ops.Value(name, dtype)
            if full:
                self.full_names.add(name)
        return self.emitted[key]

    def _reads_full(self, code: str) -> bool:
        """Whether `code` reads a reduced-dim variable, the row's tile or a full value's line."""
        return any(n in self.full_names or FULL_ATOM.fullmatch(n) for n in NAME.findall(STRING.sub("", code)))

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if self.plan.kinds[name] is not NodeKind.REDUCTION or name in self.loads:
            return super()._evaluate(name, index, mask)
        shape = self.graph[name].meta.shape
        if not at_row(index, self.index_of(shape), shape):  # the plan cuts such reads (row_reads.py)
            raise NotImplementedError(f"{name} is read at another row than the one it reduces")
        if name not in self.results:
            raise NotImplementedError(f"{name} is needed before the pass that computes it")
        return self.results[name]

    def write(self) -> ReductionSource:
        level, self.needs, self.online = passes(self.plan, self.kernel)
        count = max(level.values(), default=0)
        self.phases = [Phase() for _ in range(count + 1)]  # the last one: full stores that need every result
        for name, k in level.items():
            self.phases[k - 1].reductions.append(name)
        outs = out_pointers(self.kernel.stores)
        self.outs = outs
        row_stores = []
        for name in self.kernel.stores:
            if name in self.kernel.grouped:  # stored by _reduce_grouped, after the kernel's rows
                continue
            if self.is_full(self.index_of(self.graph[name].meta.shape)):
                self.phases[min(self.needs.get(name, 0), count)].stores.append(name)
            else:
                row_stores.append(name)
        for k, phase in enumerate(self.phases):
            self.phase = phase
            self.full_memo = {} if self.looped else self.full_memo
            if self.looped:
                self.emitted = {key: v for key, v in self.emitted.items() if not key[2]}
            for name in row_stores:  # each before the first pass after the results it needs (a gather's
                if min(self.needs.get(name, count), count) == k:  # target read before a later pass writes)
                    phase.before.append(self._store(name, outs[name]))
            for name in phase.reductions:
                if name not in self.online:  # a sum accumulated online is written with its max
                    self._reduce(name)
            for name in phase.stores:
                phase.body.append(self._store(name, outs[name]))
        aligned = {name: self._read_only_at(name) for name in row_stores}
        for k, phase in enumerate(self.phases):
            if len(phase.stores) == 1:  # a pass's one element store: each element after its loads
                (name,) = phase.stores
                aligned[name] = written_over(self._offset(name), k, self.load_sites, self.load_offsets, len(self.rows))
        groups = -(-self.xspace.numel // self.kernel.group) if self.kernel.group else 0
        return self.source(ReductionSource, outs, groups=groups, aligned=aligned)

    def source(self, kind: type[ReductionSource], outs: dict[str, str], **fields) -> ReductionSource:
        """The kernel's source of `kind` (this class's, or a kind written in its frame: a scan),
        storing to `outs` (store -> its pointer parameter), once its lines are written."""
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        wide_index = needs_wide_index(self.plan, self.xspace.numel * self.extent, args)
        return kind(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.xspace.numel,
            header=self._header(),
            body=self._body(wide_index),
            wide_index=wide_index,
            rblock=self.rblock,
            extent=self.extent,
            **fields,
        )

    def _read_only_at(self, name: str) -> tuple[str, ...]:
        """The buffers this kernel loads at `name`'s store address and nowhere else (`aligned`)."""
        offset = self._offset(name)
        return tuple(
            b
            for b, loaded in self.load_offsets.items()
            if loaded and all(o is not None and same_address(o, offset) for o in loaded)
        )

    def _offset(self, name: str) -> Expr:
        offset = Expr()
        for e, stride in zip(self.index_of(self.graph[name].meta.shape), self.plan.strides[name]):
            offset = offset + e * stride
        return offset

    def _store(self, name: str, out: str) -> str:
        meta = self.graph[name].meta
        index = self.index_of(meta.shape)
        value = self.value(name, index)
        offset = self._offset(name)
        full = self.is_full(index)
        address = paren(self.address(offset))
        if not full and not any(_has_x(e, len(self.rows)) for e in index):
            address = "xindex * 0" if offset.is_const else f"{address} + xindex * 0"  # one row: a row tile's shape
        mask = "xmask & rmask" if full else "xmask"
        return f"tl.store({out} + {address}, {ops.cast(value, meta.dtype)}, mask={mask})"

    # -- text -------------------------------------------------------------------------
    def _body(self, wide_index: bool) -> list[str]:
        """The kernel's lines after `pid`. The row length (`extent`) and a grouped kernel's rows a
        program are sizes (marked): a new sequence length changes them (a weight gradient's sum over
        B * S rows), and a kernel family makes them runtime arguments instead of new text."""
        xdefs = [
            f"x{v.dim} = {self.xspace.definition(v)}"
            for v in sorted(self.vars, key=lambda v: v.dim)
            if v.dim < len(self.rows)
        ]
        rdefs = [
            f"r{v.dim - len(self.rows)} = {self.rspace.definition(v)}"
            for v in sorted(self.vars, key=lambda v: v.dim)
            if v.dim >= len(self.rows)
        ]
        lines = [f"RBLOCK: tl.constexpr = {self.rblock}"]
        straight = [line for phase in self.phases for line in phase.before + phase.body + phase.after]
        if not self.looped:
            # a row that fills RBLOCK exactly needs no mask: a constant one the compiler folds away
            full = "tl.full([1, RBLOCK], True, tl.int1)"
            mask = f"rindex < {size(self.extent)}" if self.extent < self.rblock else full
            whole_row = ["rindex = tl.arange(0, RBLOCK)[None, :]", f"rmask = {mask}"] + rdefs
        if self.kernel.group:  # persistent, this program's rows taken XBLOCK at a time
            group = size(self.kernel.group)
            pid = "pid.to(tl.int64)" if wide_index else "pid"
            rows = [
                "xindex = xstart + xoffset + tl.arange(0, XBLOCK)[:, None]",
                f"xmask = (xoffset + tl.arange(0, XBLOCK)[:, None] < {group}) & (xindex < n_rows)",
            ]
            lines = [f"xstart = {pid} * {group}  # the first of this program's rows", *lines]
            lines += whole_row + self.prologue
            # pipelined: the next rows' loads in flight during this step's math (norm_backward_variants.py)
            lines.append(f"for xoffset in tl.range(0, {group}, XBLOCK, num_stages=2):  # this program's {group} rows")
            return lines + ["    " + line for line in rows + xdefs + straight] + self.epilogue
        lines += xdefs
        if not self.looped:
            return lines + whole_row + straight
        peeled = self.extent % self.rblock and self.extent % config.get("peel_below")
        for k, phase in enumerate(self.phases):
            lines += phase.before
            if phase.body:
                what = ", ".join(phase.reductions + phase.stores)
                extent = size(self.extent)
                step = "rindex = roffset + tl.arange(0, RBLOCK)[None, :]"
                # A row whose length is no multiple of config "peel_below" takes its last, partial
                # step apart: under the mask `rindex < 50257` no two neighbouring lanes share a mask
                # value the compiler can prove, so every load and store of every step went element
                # by element (docs/experiments.md; benchmarks/experiments/peeled_steps.py)
                if peeled:  # whole steps unmasked, then the last, partial one
                    whole = f"{extent} // RBLOCK * RBLOCK"
                    lines.append(f"for roffset in range(0, {whole}, RBLOCK):  # pass {k + 1}: {what} (whole steps)")
                    loop = [step, "rmask = tl.full([1, RBLOCK], True, tl.int1)"]
                    lines += ["    " + line for line in loop + rdefs + phase.body]
                    lines += [f"roffset = {whole}  # pass {k + 1}: its last step", step, f"rmask = rindex < {extent}"]
                    lines += rdefs + phase.body
                else:
                    lines.append(f"for roffset in range(0, {extent}, RBLOCK):  # pass {k + 1}: {what}")
                    loop = [step, f"rmask = rindex < {extent}"]
                    lines += ["    " + line for line in loop + rdefs + phase.body]
            lines += phase.after
        return lines

    def _header(self) -> list[str]:
        form = self.kernel.form
        rows = " x ".join(str(s) for s in self.xspace.shape) or "1"
        rows += " row" if self.xspace.numel == 1 else " rows"
        return [
            f"kernel {self.kernel.index}: {', '.join(self.kernel.nodes)}",
            f"  aten ops: {', '.join(dict.fromkeys(self.kernel.op_names)) or '-'}",
            f"  reduction ({form}): {rows} of {self.extent} (dims {list(self.kernel.reduced)} of "
            f"{list(self.kernel.shape)})"
            + (f"; online max-and-sum for {', '.join(self.online)}" if self.online else ""),
            f"  reads {', '.join(self.kernel.loads) or '-'}; writes {', '.join(self.kernel.stores)}",
        ]


FULL_ATOM = re.compile(r"r\d+|rindex|rmask|roffset|RBLOCK")  # what only a loop body (or the whole row) defines
NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?!\w|\s*=(?!=))")  # a name read: not an attribute, not a keyword
STRING = re.compile(r"\"[^\"]*\"|'[^']*'")
