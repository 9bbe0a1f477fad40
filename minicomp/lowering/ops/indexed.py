"""Indexed lowering rules: data movement as index arithmetic.

An indexed rule (cat, slice_scatter, constant_pad_nd, a one-hot scatter) builds its value from
inputs at shifted indexes, each load masked to the part it serves; gather, embedding and index
read their input at an index they compute (a `Dyn` atom of the index), checked against the dim's
size (`bounds`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minicomp.ir import Ref, dtypes
from minicomp.ir.dtypes import literal
from minicomp.lowering.indexing import Dyn, Expr, const, size
from minicomp.lowering.ops.core import (
    SPECIAL_SUPPORT,
    Condition,
    Op,
    all_of,
    bind,
    broadcast_index,
    cast,
    indexed,
)
from minicomp.lowering.ops.views import slice_start, sole_input, wrapped_dim


@indexed("cat")
def cat(op: Op) -> str:
    """where(d < n0, x0[d], where(d < n0 + n1, x1[d - n0], ...)), each load masked to its part;
    a part the index never (or always) falls in is dropped (or taken) as the kernel is written."""
    ndim = op.node.meta.ndim
    d = wrapped_dim(op.param("dim"), ndim)
    parts = []
    start = 0
    for ref in op.param("tensors"):
        meta = op.graph[ref.name].meta
        if meta.ndim != ndim or meta.shape[d] == 0:  # legacy 1-d empty inputs are skipped, like ATen
            continue
        parts.append((ref.name, start, start + meta.shape[d]))
        start += meta.shape[d]
    pos = op.index[d]
    result = None
    for k, (name, lo, hi) in reversed(list(enumerate(parts))):
        after = op.compare(pos, ">=", lo) if k > 0 else True
        before = op.compare(pos, "<", hi) if k < len(parts) - 1 else True
        inside = all_of([after, before])
        if inside is False:
            continue
        index = op.index[:d] + (op.index[d] - lo,) + op.index[d + 1 :]
        mask = op.mask + ((inside,) if inside is not True else ())
        v = cast(op.writer.value(name, index, mask), op.compute)
        result = v if result is None or before is True else f"tl.where({before}, {v}, {result})"
    return result


def _slice_bounds(op: Op, size: int) -> tuple[int, int, int]:
    start, step = slice_start(op.param("start"), size), op.param("step") or 1
    end = op.param("end")  # None: to the end (torch.slice_scatter's default), not 0
    return start, max(size if end is None else slice_start(end, size), start), step


def _scatter(op: Op, src: str, inside: Condition, src_index: tuple, base: Callable[[], str]) -> str:
    """where(inside, src[src_index], base()): `src` written into part of a tensor. `base` is
    only evaluated (its lines only written) where some lane of this index can take it."""
    if inside is False:
        return base()
    if inside is True:
        return cast(op.writer.value(src, src_index, op.mask), op.compute)
    inside = op.temp(inside, torch.bool)
    value = cast(op.writer.value(src, src_index, op.mask + (inside,)), op.compute)
    return f"tl.where({inside}, {value}, {base()})"


def _in_slice(op: Op, d: int) -> tuple[Condition, Expr]:
    """(whether index d lies in the slice, the index inside the slice)."""
    start, end, step = _slice_bounds(op, op.node.meta.shape[d])
    pos = op.index[d]
    on_step = op.writer.divides(pos - start, step) if step != 1 else True
    if on_step is False:  # (an interleaved part off the step: its bounds need no test)
        return False, (pos - start).floordiv(step)
    conds = [op.compare(pos, ">=", start)] if start > 0 else []
    conds += [op.compare(pos, "<", end)] if end < op.node.meta.shape[d] else []
    return all_of(conds + [on_step]), (pos - start).floordiv(step)


@indexed("slice_scatter")
def slice_scatter(op: Op) -> str:
    d = wrapped_dim(op.param("dim"), op.node.meta.ndim)
    inside, inner = _in_slice(op, d)
    return _scatter(
        op, op.args["src"].name, inside, op.index[:d] + (inner,) + op.index[d + 1 :], lambda: op.operand("self")
    )


@indexed("constant_pad_nd")
def constant_pad_nd(op: Op) -> str:
    name, meta = sole_input(op)
    pad = op.param("pad")
    index, conds = list(op.index), []
    for k in range(len(pad) // 2):
        d = meta.ndim - 1 - k
        before = pad[2 * k]
        conds += [op.compare(op.index[d], ">=", before), op.compare(op.index[d], "<", before + meta.shape[d])]
        index[d] = op.index[d] - before
    inside = all_of(conds)
    if inside is False:  # the padding alone (a window's offset past x's edge): a tile, not a Python number
        return f"tl.full({op.tile}, {literal(op.param('value'), op.compute)}, {dtypes.triton_dtype(op.compute)})"
    return _scatter(op, name, inside, tuple(index), lambda: literal(op.param("value"), op.compute))


@indexed("gather")
def gather(op: Op) -> str:
    """input[..., index[i], ...] along `dim`: the index tensor is evaluated here and becomes a
    run-time atom of the input's index (cross-entropy's target logit, read in the same kernel
    as the row's logsumexp). An index outside [0, size) raises as in eager (Op.check,
    on the index before any narrowing: 2**32 + 1 is not 1); the load is masked so that it never
    touches memory outside the input."""
    name, meta = sole_input(op)
    d = wrapped_dim(op.param("dim"), meta.ndim)
    where = op.value("index", index=op.index)
    what = f"dimension {d} (gather, cross_entropy's target)"
    op.check(bounds(where.code, meta.shape[d]), f"index out of bounds for {what}")
    position = op.temp(cast(where, torch.int32 if meta.shape[d] < 2**31 else torch.int64), torch.int32)
    index = list(op.index)
    index[d] = Expr.of(Dyn(position, meta.shape[d], op.writer.is_full(op.index)))
    inside = op.temp(f"({position} >= 0) & ({position} < {meta.shape[d]})", torch.bool)
    return cast(op.writer.value(name, tuple(index), op.mask + (inside,)), op.compute)


def _at_position(op: Op, where, extent: int, what: str, negative: bool = False) -> tuple[Expr, str]:
    """(the index atom of a position read from tensor data, the lanes where it lies inside the
    dim): `where` must lie in [0, extent) ([-extent, extent) when `negative`, counted from the end, as
    advanced indexing allows); outside, it raises as in eager (Op.check) and the load is masked."""
    op.check(bounds(where.code, extent, negative), f"index out of bounds for {what}")
    wide = torch.int32 if extent < 2**31 else torch.int64
    code = cast(where, wide)
    if negative:
        code = f"tl.where({code} < 0, {code} + {size(extent)}, {code})"
    position = op.temp(code, wide)
    inside = op.temp(bounds(position, extent), torch.bool)
    return Expr.of(Dyn(position, extent, op.writer.is_full(op.index))), inside


def bounds(code: str, extent: int, negative: bool = False) -> str:
    """`code` lies in [0, extent) ([-extent, extent) when `negative`), the extent written as a
    marked size: a kernel family makes it a runtime size like the index's (codegen/families.py),
    so a check does not make each new length new Triton text. (Its error message names no size
    for the same reason.)"""
    low = f"-{size(extent)}" if negative else "0"
    return f"({code} >= {low}) & ({code} < {size(extent)})"


@indexed("embedding")
def embedding(op: Op) -> str:
    """weight[indices[i...], d] (a table lookup: out is indices' shape + [D]), a load at a run-time
    row as gather's, so the lookups of a model's tables fuse with what reads them (DLRM's stack of
    26 tables, a transformer's token + position embeddings) instead of an ATen kernel each.
    padding_idx and scale_grad_by_freq only change the backward."""
    ref = op.args["weight"]
    rows = op.graph[ref.name].meta.shape[0]
    row, inside = _at_position(op, op.value("indices", index=op.index[:-1]), rows, "embedding's rows")
    return cast(op.writer.value(ref.name, (row, op.index[-1]), op.mask + (inside,)), op.compute)


@indexed("index_select")
def index_select(op: Op) -> str:
    """self[..., index[i], ...] along `dim` (index 1-d, or a 0-d one)."""
    name, meta = sole_input(op)
    d = wrapped_dim(op.param("dim"), meta.ndim)
    at = (op.index[d],) if op.graph[op.args["index"].name].meta.ndim else ()
    position, inside = _at_position(op, op.value("index", index=at), meta.shape[d], f"dimension {d} (index_select)")
    index = op.index[:d] + (position,) + op.index[d + 1 :]
    return cast(op.writer.value(name, index, op.mask + (inside,)), op.compute)


@indexed("index")
def advanced_index(op: Op) -> str:
    """self[i0, :, i2] (aten.index.Tensor): the dims given integer index tensors are read at
    positions those tensors hold, broadcast together to a shape B. As in NumPy and eager, B takes
    the place of those dims when they are adjacent (`x[:, i, j]`: DLRM's pairs of a [B, 27, 27]
    product), else it goes first. Negative positions count from the end."""
    name, meta = sole_input(op)
    tensors = [(d, ref) for d, ref in enumerate(op.param("indices")) if ref is not None]
    shapes = [op.graph[ref.name].meta.shape for _, ref in tensors]
    nb = len(torch.broadcast_shapes(*shapes))
    dims = [d for d, _ in tensors]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    first = dims[0] if adjacent else 0
    b_index = op.index[first : first + nb]
    rest = iter(op.index[:first] + op.index[first + nb :])
    index, mask = [], list(op.mask)
    given = dict(tensors)
    for d in range(meta.ndim):
        if d not in given:
            index.append(next(rest))
            continue
        where = op.writer.value(given[d].name, broadcast_index(b_index, op.graph[given[d].name].meta.shape), op.mask)
        position, inside = _at_position(op, where, meta.shape[d], f"dimension {d}", negative=True)
        index.append(position)
        mask.append(inside)
    return cast(op.writer.value(name, tuple(index), tuple(mask)), op.compute)


def _index_supported(node, graph) -> bool:
    """Integer index tensors only (a bool mask's result shape depends on its values)."""
    args = bind(node)
    refs = [ref for ref in args["indices"] if ref is not None]
    integers = (torch.int8, torch.int16, torch.int32, torch.int64)  # uint8 indexes as a mask, as bool does
    return bool(refs) and all(isinstance(ref, Ref) and graph[ref.name].meta.dtype in integers for ref in refs)


SPECIAL_SUPPORT["index"] = _index_supported


@indexed("scatter")
def scatter(op: Op) -> str:
    """`self` with `src` (or the scalar `value`) written, along `dim`, at the position the index
    tensor holds: out[..., j, ...] = src[..., 0, ...] where j == index[..., 0, ...], else
    self[..., j, ...]. Lowered for an index one long along `dim` (a one-hot: nll_loss's backward
    scatters -1 at each row's target into zeros), as a compare of the position with the index;
    positions the index tensor does not cover keep `self`. An index outside [0, size) raises as
    in eager (Op.check)."""
    meta = op.node.meta
    d = wrapped_dim(op.param("dim"), meta.ndim)
    index_meta = op.graph[op.args["index"].name].meta
    covered = all_of(
        op.compare(op.index[k], "<", n) for k, n in enumerate(index_meta.shape) if k != d and n < meta.shape[k]
    )
    if covered is False:
        return op.operand("self")
    inside = () if covered is True else (op.temp(covered, torch.bool),)
    at = op.index[:d] + (const(0),) + op.index[d + 1 :]  # where index (and src) are read
    where = op.writer.value(op.args["index"].name, at, op.mask + inside)
    op.check(
        bounds(where.code, meta.shape[d]),
        f"index out of bounds for dimension {d} (scatter, one_hot)",
        index=at,
        mask=op.mask + inside,
    )
    hit = " & ".join([f"({op.writer.index_text(op.index[d])} == {where.code})", *inside])
    src = op.args.get("src")
    value = (
        cast(op.writer.value(src.name, at, op.mask + inside), op.compute)
        if isinstance(src, Ref)
        else literal(op.param("value"), op.compute)
    )
    if op.compute == torch.bool and not isinstance(src, Ref):  # (a bare 1 would make the result int32)
        value = f"tl.full([], {value}, tl.int1)"
    return f"tl.where({op.temp(hit, torch.bool)}, {value}, {op.operand('self')})"


def _scatter_supported(node, graph) -> bool:
    """One-hot scatters only: no reduce, the index one long along `dim` and as many dims as self."""
    if node.target._overloadname not in ("value", "src"):
        return False
    args = bind(node)
    meta, index = node.meta, graph[args["index"].name].meta
    d = wrapped_dim(args["dim"], meta.ndim)
    if meta.ndim == 0 or index.ndim != meta.ndim or index.shape[d] != 1:
        return False
    return all(n <= s for n, s in zip(index.shape, meta.shape))


SPECIAL_SUPPORT["scatter"] = _scatter_supported
