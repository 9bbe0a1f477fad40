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
@triton.jit helpers (`_sum`, `_max_nan`, ...: templates/module.py.j2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minicomp.codegen.kernel import INT32_LIMIT, KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.codegen.reduction_passes import passes
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Dyn, Expr, FloorDiv, IterationSpace, Mod, Var, const
from minicomp.lowering.ops.reductions import helper, identity, spec
from minicomp.plan.fusion import Kernel, Plan


def write(plan: Plan, kernel: Kernel) -> KernelSource:
    """The kernel's source; a looped kernel is written twice, the first time to learn which passes
    load each address (`ReductionWriter.eviction`)."""
    if not kernel.looped:
        return ReductionWriter(plan, kernel).write()
    survey = ReductionWriter(plan, kernel)
    survey.write()
    return ReductionWriter(plan, kernel, survey.passes).write()


@dataclass
class Phase:
    """One pass over the row: its reductions and full-space stores, and the row values
    computed before it (`before`), the loop body (`body`) and what follows the loop (`after`)."""

    reductions: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


class ReductionWriter(KernelWriter):
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
        self.passes: dict[tuple[str, Expr], set[int]] = {}  # (buffer, offset) -> the passes that load it
        self.pass_survey = survey  # ... as an earlier writing of this kernel found them

    # -- the index -----------------------------------------------------------
    def _full_index(self):
        x = iter(range(len(self.rows)))
        r = iter(range(len(self.kernel.reduced)))
        for d in range(len(self.kernel.shape)):
            yield self.rspace.var(next(r)) if d in self.kernel.reduced else self.xspace.var(next(x))

    def index_of(self, shape: tuple[int, ...]) -> tuple[Expr, ...]:
        """Where a value of `shape` (the space, or its rows) is evaluated in this kernel."""
        full = self.kernel.shape
        if tuple(shape) == tuple(full):
            return self.full_index
        if len(shape) == len(full):  # rows, reduced dims kept as 1
            return tuple(const(0) if d in self.kernel.reduced else e for d, e in enumerate(self.full_index))
        # the rows with dims of size 1 added or dropped: the sized dims are the rows', in order
        rows = iter(e for d, e in enumerate(self.full_index) if d not in self.kernel.reduced and full[d] != 1)
        return tuple(const(0) if s == 1 else next(rows) for s in shape)

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
        try:
            return super().load(name, index, mask)
        finally:
            self.hoisting = outer

    def eviction(self, name: str, offset: Expr, index) -> str | None:
        """Inductor's L2 policy for a looped kernel's loads of the row: an address a later pass
        loads again is kept (evict_last) and let go at its last load (evict_first); so is a value
        every row reads (a norm's weight). RMSNorm over [32768, 4096] float32, looped 2048 a step,
        H200: 1.041 -> 1.005x the memory floor (benchmarks/experiments/reduction_variants.py).
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
        """A line in the loop body (a full value) or before the loop (a row value)."""
        full = self.full
        lines = self.prologue if self.hoisting else self.phase.body if full else self.phase.before
        key = (code, dtype, full)
        if key not in self.emitted:
            name = self.fresh(hint)
            lines.append(f"{name} = {code}" + (f"  # {comment}" if comment else ""))
            self.emitted[key] = ops.Value(name, dtype)
        return self.emitted[key]

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if self.plan.kinds[name] != "reduction" or name in self.loads:
            return super()._evaluate(name, index, mask)
        if index != self.index_of(self.graph[name].meta.shape):
            raise NotImplementedError(f"{name} is read at another row than the one it reduces")
        if name not in self.results:
            raise NotImplementedError(f"{name} is needed before the pass that computes it")
        return self.results[name]

    def write(self) -> KernelSource:
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
        for phase in self.phases:
            self.phase = phase
            self.full_memo = {} if self.looped else self.full_memo
            if self.looped:
                self.emitted = {k: v for k, v in self.emitted.items() if not k[2]}
            for name in phase.reductions:
                if name not in self.online:  # a sum accumulated online is written with its max
                    self._reduce(name)
            for name in phase.stores:
                phase.body.append(self._store(name, outs[name]))
        self.phase = self.phases[-1]
        for name in row_stores:
            self.phase.after.append(self._store(name, outs[name]))
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        return KernelSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.xspace.numel,
            header=self._header(),
            body=self._body(),
            wide_index=needs_wide_index(self.graph, self.xspace.numel * self.extent, args),
            row=self.rblock,
            extent=self.extent,
            groups=-(-self.xspace.numel // self.kernel.group) if self.kernel.group else 0,
        )

    def _store(self, name: str, out: str) -> str:
        meta = self.graph[name].meta
        index = self.index_of(meta.shape)
        value = self.value(name, index)
        offset = Expr()
        for e, stride in zip(index, self.plan.strides[name]):
            offset = offset + e * stride
        full = self.is_full(index)
        address = paren(self.address(offset))
        if not full and not any(_has_x(e, len(self.rows)) for e in index):
            address = "xindex * 0" if offset.is_const else f"{address} + xindex * 0"  # one row: a row tile's shape
        mask = "xmask & rmask" if full else "xmask"
        return f"tl.store({out} + {address}, {ops.cast(value, meta.dtype)}, mask={mask})"

    def _reduce(self, name: str) -> None:
        """The lines that compute reduction `name` in this phase (a looped kernel's max also computes
        the sum accumulated online with it, its partner)."""
        if name in self.kernel.grouped:
            self._reduce_grouped(name)
            return
        partner = next((s for s, m in self.online.items() if m == name), None)
        r = spec(self.graph[name], self.graph)
        acc_dtype = r.acc
        init = identity(r.combine, acc_dtype)
        # an online max loads its operand with -inf in the lanes past the row (no select after;
        # every other reader of those lanes masks them). With _exp_shift's select on the row's max
        # instead of every element: bf16 cross-entropy [8192, 32000], H200, 1.204 -> 1.184x the
        # floor (first kernel; benchmarks/experiments/reduction_variants.py)
        operand = self._filled(r.source, init) if self.looped and partner is not None else None
        operand = operand or self.value(r.source, self.full_index)
        v = self._operand(r, operand)
        tl_acc = dtypes.triton_dtype(acc_dtype)
        combine = helper(r.combine, acc_dtype)
        result = self.fresh(name)
        if r.combine in ("argmax", "argmin"):
            self._reduce_with_index(name, r, v, result)
            return
        if not self.looped:
            reduced = f"tl.reduce(tl.where(rmask, {v}, {init}), 1, {combine})[:, None]"
            self.phase.after.append(f"{result} = {self._finish(r, reduced)}  # {self.graph[name].op_name}")
            self.results[name] = ops.Value(result, _result_dtype(r))
            return
        acc = self.fresh(f"{name}_acc")
        if partner is None:  # an elementwise accumulator, reduced along the row after the loop
            self.phase.before.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {tl_acc})")
            self.phase.body.append(f"{acc} = tl.where(rmask, {combine}({acc}, {v}), {acc})")
            reduced = f"tl.reduce({acc}, 1, {combine})[:, None]"
            self.phase.after.append(f"{result} = {self._finish(r, reduced)}  # {self.graph[name].op_name}")
            self.results[name] = ops.Value(result, _result_dtype(r))
            return
        # online softmax: per row, the running max and the running sum of exp(v - max), the sum
        # rescaled by exp(old max - new max) when a block raises the max: one exp per element
        total = self.fresh(f"{partner}_acc")
        block_max, grown = self.fresh(f"{name}_block"), self.fresh(f"{name}_next")
        self.phase.before.append(f"{acc} = tl.full([XBLOCK, 1], {init}, {tl_acc})")
        self.phase.before.append(f"{total} = tl.full([XBLOCK, 1], 0.0, tl.float32)")
        if self.filled.get(v) == init:
            block_max = v
        else:
            self.phase.body.append(f"{block_max} = tl.where(rmask, {v}, {init})")
        self.phase.body += [
            f"{grown} = {combine}({acc}, tl.reduce({block_max}, 1, {combine})[:, None])",
            f"{total} = {total} * _exp_shift({acc}, {grown})"
            f" + tl.reduce(_exp_shift({block_max}, {grown}), 1, _sum)[:, None]",
            f"{acc} = {grown}",
        ]
        self.phase.after.append(f"{result} = {acc}  # {self.graph[name].op_name}")
        self.results[name] = ops.Value(result, acc_dtype)
        summed = self.fresh(partner)
        self.phase.after.append(
            f'{summed} = tl.where({result} == float("-inf"), float("nan"), {total})'
            f"  # sum of exp({r.source} - {name}), accumulated online"
        )
        self.results[partner] = ops.Value(summed, torch.float32)

    def _filled(self, name: str, fill: str) -> ops.Value:
        """`name`'s full tile, its loads (when not already written in this pass) holding `fill`
        in their masked-off lanes."""
        outer, self.fill = self.fill, fill
        try:
            return self.value(name, self.full_index)
        finally:
            self.fill = outer

    def _reduce_grouped(self, name: str) -> None:
        """A row-group partial (split_reductions.py): its operand, the value its chunks view cuts,
        is evaluated at this kernel's index; each program adds each step's XBLOCK rows into one
        accumulator row [1, RBLOCK] (not a tile: fewer registers; bf16 LayerNorm backward, H200,
        0.399 -> 0.254 ms, norm_backward_variants.py) and writes it as partial row `pid`."""
        r = spec(self.graph[name], self.graph)
        v = self._operand(r, self.value(self.graph.grouped_source(name), self.full_index))
        init, combine = identity(r.combine, r.acc), helper(r.combine, r.acc)
        acc, result = self.fresh(f"{name}_acc"), self.fresh(name)
        self.prologue.append(f"{acc} = tl.full([1, RBLOCK], {init}, {dtypes.triton_dtype(r.acc)})")
        these_rows = f"tl.reduce(tl.where(xmask & rmask, {v}, {init}), 0, {combine})[None, :]"
        self.phase.after.append(f"{acc} = {combine}({acc}, {these_rows})")
        offset = Expr()
        for d, stride in zip(self.kernel.reduced, self.plan.strides[name][1:]):
            offset = offset + self.full_index[d] * stride
        programs, step = self.graph[name].meta.shape[0], self.plan.strides[name][0]
        row = f"pid.to(tl.int64) * {step}" if programs * step > INT32_LIMIT else f"pid * {step}"
        self.epilogue += [
            f"{result} = {self._finish(r, acc)}  # {r.combine} of its rows",
            f"tl.store({self.outs[name]} + {row} + {paren(self.address(offset))}, {result}, mask=rmask)",
        ]

    def _operand(self, r, operand: ops.Value) -> str:
        if r.acc == torch.int8:  # any / all: reduce x != 0
            return f"({ops.cast(operand, torch.bool)}).to(tl.int8)"
        return ops.cast(operand, r.acc)

    def _finish(self, r, reduced: str) -> str:
        if r.divide != 1:
            return f"{reduced} / {r.divide}.0"
        if r.acc == torch.int8:
            return f"({reduced} != 0)"
        return reduced

    def _reduce_with_index(self, name: str, r, v: str, result: str) -> None:
        """argmax / argmin: (value, position in the row) pairs; ties take the first position,
        NaN counts as the largest (argmax) and smallest (argmin) value, as in eager."""
        combine = helper(r.combine, r.acc)
        init = identity(r.combine, r.acc)
        where = "rindex + tl.full([XBLOCK, RBLOCK], 0, tl.int32)"
        if not self.looped:
            self.phase.after.append(
                f"_, {result} = tl.reduce((tl.where(rmask, {v}, {init}), {where}), 1, {combine})  # {r.combine}"
            )
        else:
            best, at = self.fresh(f"{name}_best"), self.fresh(f"{name}_at")
            tl_acc = dtypes.triton_dtype(r.acc)
            self.phase.before += [
                f"{best} = tl.full([XBLOCK, RBLOCK], {init}, {tl_acc})",
                f"{at} = tl.full([XBLOCK, RBLOCK], 0, tl.int32)",
            ]
            self.phase.body.append(f"{best}, {at} = {combine}({best}, {at}, tl.where(rmask, {v}, {init}), {where})")
            self.phase.after.append(f"_, {result} = tl.reduce(({best}, {at}), 1, {combine})  # {r.combine}")
        self.phase.after.append(f"{result} = {result}[:, None].to(tl.int64)")
        self.results[name] = ops.Value(result, torch.int64)

    # -- text -------------------------------------------------------------------------
    def _body(self) -> list[str]:
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
            mask = f"rindex < {self.extent}" if self.extent < self.rblock else "tl.full([1, RBLOCK], True, tl.int1)"
            whole_row = ["rindex = tl.arange(0, RBLOCK)[None, :]", f"rmask = {mask}"] + rdefs
        if self.kernel.group:  # persistent, this program's rows taken XBLOCK at a time
            group = self.kernel.group
            rows = [
                "xindex = xstart + xoffset + tl.arange(0, XBLOCK)[:, None]",
                f"xmask = (xoffset + tl.arange(0, XBLOCK)[:, None] < {group}) & (xindex < n_rows)",
            ]
            lines += whole_row + self.prologue
            # pipelined (the next rows' loads in flight during this step's math): bf16 RMSNorm
            # backward, H200, 0.232 -> 0.209 ms, LayerNorm's 0.254 -> 0.220 (norm_backward_variants.py)
            lines.append(f"for xoffset in tl.range(0, {group}, XBLOCK, num_stages=2):  # this program's {group} rows")
            return lines + ["    " + line for line in rows + xdefs + straight] + self.epilogue
        lines += xdefs
        if not self.looped:
            return lines + whole_row + straight
        for k, phase in enumerate(self.phases):
            lines += phase.before
            if phase.body:
                what = ", ".join(phase.reductions + phase.stores)
                lines.append(f"for roffset in range(0, {self.extent}, RBLOCK):  # pass {k + 1}: {what}")
                loop = ["rindex = roffset + tl.arange(0, RBLOCK)[None, :]", f"rmask = rindex < {self.extent}"]
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


def _result_dtype(r) -> torch.dtype:
    return torch.bool if r.acc == torch.int8 else r.acc


def _has_r(expr: Expr, first_r: int) -> bool:
    return any(_atom_has(atom, lambda v: v.dim >= first_r, "rindex") for atom, _ in expr.terms)


def _has_x(expr: Expr, first_r: int) -> bool:
    return any(_atom_has(atom, lambda v: v.dim < first_r, "xindex") for atom, _ in expr.terms)


def _atom_has(atom, test, base: str) -> bool:
    if isinstance(atom, Var):
        return test(atom)
    if isinstance(atom, (FloorDiv, Mod)):
        return any(_atom_has(a, test, base) for a, _ in atom.expr.terms)
    if isinstance(atom, Dyn):
        return atom.full if base == "rindex" else True
    return getattr(atom, "base", None) == base
