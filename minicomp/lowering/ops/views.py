"""View lowering rules: a view moves no data; its rule maps the index of its output to the index
of its input, and the load happens there (indexed.py: rules that build a value from loads at
computed indexes).
"""

from __future__ import annotations

import torch

from minicomp.ir import TensorMeta
from minicomp.lowering.indexing import Expr, const, contiguous_strides
from minicomp.lowering.ops.core import (
    SPECIAL_SUPPORT,
    Op,
    broadcast_index,
    view,
)

# -- views: the input's index, given the output's ---------------------------------


def wrapped_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def sole_input(op: Op) -> tuple[str, TensorMeta]:
    ref = op.args["self"]
    return ref.name, op.graph[ref.name].meta


@view("alias", "clone", "lift_fresh_copy", "contiguous")
def identity(op: Op, index):
    return sole_input(op)[0], index


@view("expand")
def expand(op: Op, index):
    name, meta = sole_input(op)
    return name, broadcast_index(index, meta.shape)


@view("permute")
def permute(op: Op, index):
    name, meta = sole_input(op)
    dims = [wrapped_dim(d, meta.ndim) for d in op.param("dims")]
    result = [None] * meta.ndim
    for out_pos, in_dim in enumerate(dims):
        result[in_dim] = index[out_pos]
    return name, tuple(result)


@view("unsqueeze")
def unsqueeze(op: Op, index):
    name, meta = sole_input(op)
    d = wrapped_dim(op.param("dim"), meta.ndim + 1)
    return name, index[:d] + index[d + 1 :]


@view("squeeze")
def squeeze(op: Op, index):
    name, meta = sole_input(op)
    dims = op.param("dims") if "dims" in op.args else op.param("dim")
    dims = range(meta.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
    wrapped = [wrapped_dim(d, meta.ndim) for d in dims] if meta.ndim else []
    dropped = {d for d in wrapped if meta.shape[d] == 1}
    it = iter(index)
    return name, tuple(const(0) if d in dropped else next(it) for d in range(meta.ndim))


@view("select")
def select(op: Op, index):
    name, meta = sole_input(op)
    d = wrapped_dim(op.param("dim"), meta.ndim)
    i = op.param("index")
    i = i + meta.shape[d] if i < 0 else i
    return name, index[:d] + (const(i),) + index[d:]


def slice_start(start, size: int) -> int:
    """PyTorch's start of a slice: negative counts from the end, clamped to [0, size]."""
    start = 0 if start is None else start
    start = start + size if start < 0 else start
    return min(max(start, 0), size)


@view("slice")
def slice_(op: Op, index):
    name, meta = sole_input(op)
    d = wrapped_dim(op.param("dim"), meta.ndim)
    start, step = slice_start(op.param("start"), meta.shape[d]), op.param("step") or 1
    return name, index[:d] + (index[d] * step + start,) + index[d + 1 :]


@view("flip")
def flip(op: Op, index):
    name, meta = sole_input(op)
    dims = {wrapped_dim(d, meta.ndim) for d in op.param("dims")}
    return name, tuple(const(meta.shape[d] - 1) - e if d in dims else e for d, e in enumerate(index))


@view("view", "reshape")
def reshape(op: Op, index):
    name, meta = sole_input(op)
    return name, reshape_index(index, op.node.meta.shape, meta.shape)


def _view_supported(node, graph) -> bool:
    """view(dtype) lowers as a bitcast between dtypes of one size (not bool); one that changes the
    last dim (float32 -> int16) is an ATen call."""
    if node.target is not torch.ops.aten.view.dtype:
        return True
    was, now = graph[node.inputs()[0]].meta.dtype, node.meta.dtype
    return was.itemsize == now.itemsize and torch.bool not in (was, now)


SPECIAL_SUPPORT["view"] = _view_supported


def reshape_index(index, out_shape, in_shape) -> tuple[Expr, ...]:
    """Index into `in_shape` of the element at `index` of the same data viewed as `out_shape`.

    Dims are matched in groups of equal element count (size-1 dims carry no
    index), so only dims that are really divided or merged get // and %.
    """
    out_dims = [(e, s) for e, s in zip(index, out_shape) if s != 1]
    in_sizes = [s for s in in_shape if s != 1]
    inner: list[Expr] = []
    o = i = 0
    while i < len(in_sizes):
        group_out, group_in = [o], [i]
        out_n, in_n = out_dims[o][1], in_sizes[i]
        while out_n != in_n:
            if out_n < in_n:
                o += 1
                out_n *= out_dims[o][1]
                group_out.append(o)
            else:
                i += 1
                in_n *= in_sizes[i]
                group_in.append(i)
        linear = const(0)
        sizes = [out_dims[k][1] for k in group_out]
        for k, stride in zip(group_out, contiguous_strides(sizes)):
            linear = linear + out_dims[k][0] * stride
        sizes = [in_sizes[k] for k in group_in]
        inner += [linear.floordiv(stride).mod(size) for size, stride in zip(sizes, contiguous_strides(sizes))]
        o, i = o + 1, i + 1
    it = iter(inner)
    return tuple(const(0) if s == 1 else next(it) for s in in_shape)


# -- indexed: values made of inputs at several indexes -----------------------------
