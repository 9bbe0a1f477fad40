"""The lines that compute one reduction of a reduction kernel (codegen/reduction.py), in the
writer's current phase: a persistent row reduced at once, a looped row's elementwise
accumulator reduced after its loop, a max and the sum of exp(x - max) accumulated together
online, a row group's partial (split_reductions.py), and argmax / argmin with their positions.
"""

from __future__ import annotations

import torch

from minicomp.codegen.kernel import INT32_LIMIT, paren
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr
from minicomp.lowering.ops.reductions import helper, identity, spec


class ReductionLines:
    """Mixed into ReductionWriter: `_reduce(name)` writes reduction `name` into `self.phase`."""

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
        # every other reader of those lanes masks them), and _exp_shift selects on the row's max
        # instead of every element (benchmarks/experiments/reduction_variants.py)
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
            self.results[name] = self._rounded_result(name, ops.Value(result, result_dtype(r)))
            return
        acc = self.fresh(f"{name}_acc")
        if partner is None:  # an elementwise accumulator, reduced along the row after the loop
            self.phase.before.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {tl_acc})")
            self.phase.body.append(f"{acc} = tl.where(rmask, {combine}({acc}, {v}), {acc})")
            reduced = f"tl.reduce({acc}, 1, {combine})[:, None]"
            self.phase.after.append(f"{result} = {self._finish(r, reduced)}  # {self.graph[name].op_name}")
            self.results[name] = self._rounded_result(name, ops.Value(result, result_dtype(r)))
            return
        self._reduce_online(name, partner, r, v, acc, result)

    def _rounded_result(self, name: str, value: ops.Value) -> ops.Value:
        """A 16-bit reduction's result rounded to its dtype where it is computed, as eager's is: its
        readers in this kernel use the value a later kernel, or a backward, loads (a forward that
        divided by the unrounded amax, and stored the quotient for an amin whose backward recomputed
        it from the stored amax, matched no element there: NaN gradients)."""
        dtype = self.graph[name].meta.dtype
        if dtype not in dtypes.LOW_PRECISION or value.dtype != torch.float32:
            return value
        rounded = self.fresh(name)
        self.phase.after.append(f"{rounded} = {value.code}.to({dtypes.triton_dtype(dtype)}).to(tl.float32)  # rounded")
        return ops.Value(rounded, torch.float32)

    def _reduce_online(self, name: str, partner: str, r, v: str, acc: str, result: str) -> None:
        """Online softmax: per row, the running max and the running sum of exp(v - max), the sum
        rescaled by exp(old max - new max) when a block raises the max: one exp per element."""
        init, combine, tl_acc = identity(r.combine, r.acc), helper(r.combine, r.acc), dtypes.triton_dtype(r.acc)
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
        self.results[name] = self._rounded_result(name, ops.Value(result, r.acc))
        if self.results[name].code != result:  # the sum taken against the rounded max: exp(v - m) * exp(m - r)
            total = f"{total} * tl.exp({result} - {self.results[name].code})"
        summed = self.fresh(partner)
        self.phase.after.append(
            f'{summed} = tl.where({result} == float("-inf"), float("nan"), {total})'
            f"  # sum of exp({r.source} - {name}), accumulated online"
        )
        self.results[partner] = self._rounded_result(partner, ops.Value(summed, torch.float32))

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
        accumulator row [1, RBLOCK] (not a tile: fewer registers; norm_backward_variants.py) and
        writes it as partial row `pid`."""
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
        if r.truth:  # any / all: reduce x != 0 (an int8 amax or sum(dtype=int8) reduces values)
            return f"({ops.cast(operand, torch.bool)}).to(tl.int8)"
        return ops.cast(operand, r.acc)

    def _finish(self, r, reduced: str) -> str:
        if r.divide != 1:
            return f"{reduced} / {r.divide}.0"
        if r.truth:
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


def result_dtype(r) -> torch.dtype:
    return torch.bool if r.truth else r.acc
