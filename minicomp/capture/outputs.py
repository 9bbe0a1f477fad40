"""How a call's result is put together from what a compiled graph returns: one record per output leaf.

A graph returns only the tensors the function computed. Every other leaf of the result is
recorded by what it is:

    GraphOutput(index)                          the graph's index-th output
    Constant(value)                             a value that is not a tensor (the same for every call
                                                of the signature: it depends on shapes, dtypes, scalars)
    Argument(slot)                              the argument at leaf `slot` itself (`return x.mul_(2)`)
    ArgumentView(slot, shape, stride, offset)   a view of that argument, `offset` elements past its own
                                                (read as `dtype` when given: `x.view(torch.int32)`)
    SameAs(leaf)                                the very object of output leaf `leaf` (`return y, y`)
    OutputView(leaf, index, shape, stride, offset, base_shape, base_stride)
                                                a view of output leaf `leaf` (`return y, y[1:]`), where
                                                that one comes out laid out as traced; else the
                                                graph's index-th output (the same values, a copy)
    ConstantView(tensor, shape, stride, offset) a view of a tensor the function closes over (`W[1:]`
                                                of a global W: kept by the record, never stored on disk)

so a returned argument is the caller's object, a returned view writes through to its base,
and strings, numbers, devices and sizes come back as they are: eager's aliasing and types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree


@dataclass(frozen=True, slots=True)
class GraphOutput:
    """The graph's `index`-th output."""

    index: int


@dataclass(frozen=True, slots=True)
class Constant:
    """A value that is not a tensor, returned as it was traced."""

    value: object


@dataclass(frozen=True, slots=True)
class Argument:
    """The argument at leaf `slot`, returned as the caller's own object."""

    slot: int


@dataclass(frozen=True, slots=True)
class ArgumentView:
    """A view of the argument at leaf `slot`: its shape and stride, `offset` elements past the
    argument's own storage offset; with `dtype` (a view(dtype) of another dtype), the argument's
    bits read as `dtype`, the shape, stride and offset counted in its elements."""

    slot: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype | None = None


@dataclass(frozen=True, slots=True)
class SameAs:
    """The very object of an earlier output leaf (`leaf`, its position in the result)."""

    leaf: int


@dataclass(frozen=True, slots=True, eq=False)
class ConstantView:
    """A view of `tensor`, a tensor the function closes over (the signature's key holds it by
    identity): as ArgumentView's fields, counted from its own storage offset."""

    tensor: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype | None = None


@dataclass(frozen=True, slots=True)
class OutputView:
    """A view of output leaf `leaf` (a tensor the graph returns): its shape and stride, `offset`
    elements past that leaf's storage offset, where that leaf came out at `base_shape` and
    `base_stride` (its traced layout); else the graph's `index`-th output, the view's values."""

    leaf: int
    index: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    base_shape: tuple[int, ...]
    base_stride: tuple[int, ...]
    dtype: torch.dtype | None = None  # a view(dtype) of the leaf: counted in this dtype's elements


OutputRecord = GraphOutput | Constant | Argument | ArgumentView | SameAs | ConstantView | OutputView


def view_fields(out: torch.Tensor, base: torch.Tensor) -> tuple[tuple, tuple, int, torch.dtype | None]:
    """(shape, stride, offset, dtype) of `out`, a view of `base`, for a view record: `offset`
    elements past base's storage offset; one of another dtype counted in its elements, from
    `base.view(dtype)` (ValueError where base has no such view)."""
    dtype, start = None, base.storage_offset()
    if out.dtype != base.dtype:
        try:
            start = base.view(out.dtype).storage_offset()
        except RuntimeError as err:
            raise ValueError(str(err)) from None
        dtype = out.dtype
    return tuple(out.shape), tuple(out.stride()), out.storage_offset() - start, dtype


class Outputs:
    """The result's structure (`spec`: a torch.Size stays one leaf) and a record per leaf."""

    def __init__(self, spec, records: list[OutputRecord]):
        self.spec, self.records = spec, records
        # the graph's outputs are the result's leaves, in order: a call only unflattens them
        self.simple = all(type(r) is GraphOutput and r.index == i for i, r in enumerate(records))

    def assemble(self, outputs, leaves):
        """The function's result from the graph's `outputs` and the call's argument `leaves`."""
        values = []
        for record in self.records:
            form = type(record)
            if form is GraphOutput:
                values.append(outputs[record.index])
            elif form is Constant:
                values.append(record.value)
            elif form is Argument:
                values.append(leaves[record.slot])
            elif form is ArgumentView or form is ConstantView:
                base = leaves[record.slot] if form is ArgumentView else record.tensor
                if record.dtype is not None:
                    base = base.view(record.dtype)
                values.append(base.as_strided(record.shape, record.stride, base.storage_offset() + record.offset))
            elif form is OutputView:
                base = values[record.leaf]
                if base.shape == record.base_shape and base.stride() == record.base_stride:
                    base = base if record.dtype is None else base.view(record.dtype)
                    values.append(base.as_strided(record.shape, record.stride, base.storage_offset() + record.offset))
                else:
                    values.append(outputs[record.index])
            else:
                values.append(values[record.leaf])
        return pytree.tree_unflatten(values, self.spec)

    # -- the persistent index keeps them as JSON (dispatch/persist.py) -------------------
    def dumps(self) -> dict | None:
        """A JSON-able form, or None when a constant has none (such an entry is not stored)."""
        encoded = [_dump(record) for record in self.records]
        if None in encoded:
            return None
        try:
            spec = pytree.treespec_dumps(self.spec)
        except NotImplementedError:  # a structure pytree cannot write: torch.return_types (`x.max(-1)`)
            return None
        return {"spec": spec, _RECORDS: encoded}

    @staticmethod
    def loads(stored: dict) -> Outputs:
        return Outputs(pytree.treespec_loads(stored["spec"]), [_load(item) for item in stored[_RECORDS]])


# On disk (an entry's "outputs"), records are lists headed by a tag, under the key "kinds": the
# format of the entries a cache already holds.
_RECORDS = "kinds"


def _dump(record: OutputRecord) -> list | None:
    """[tag, fields...]; None for a constant with no JSON form."""
    form = type(record)
    if form is ConstantView:  # (a tensor of this process)
        return None
    if form is Constant:
        value = _encode(record.value)
        return None if value is None else ["const", value]
    if form is ArgumentView:
        dtype = [] if record.dtype is None else [str(record.dtype).removeprefix("torch.")]
        return ["view", record.slot, list(record.shape), list(record.stride), record.offset, *dtype]
    if form is GraphOutput:
        return ["tensor", record.index]
    if form is Argument:
        return ["input", record.slot]
    if form is OutputView:
        dtype = [] if record.dtype is None else [str(record.dtype).removeprefix("torch.")]
        return ["outview", record.leaf, record.index, list(record.shape), list(record.stride), record.offset,
                list(record.base_shape), list(record.base_stride), *dtype]  # fmt: skip
    return ["same", record.leaf]


def _load(item: list) -> OutputRecord:
    tag = item[0]
    if tag == "const":
        return Constant(_decode(item[1]))
    if tag == "view":
        dtype = getattr(torch, item[5]) if len(item) > 5 else None
        return ArgumentView(int(item[1]), tuple(item[2]), tuple(item[3]), int(item[4]), dtype)
    if tag == "tensor":
        return GraphOutput(int(item[1]))
    if tag == "input":
        return Argument(int(item[1]))
    if tag == "same":
        return SameAs(int(item[1]))
    if tag == "outview":
        leaf, index, shape, stride, offset, base_shape, base_stride = item[1:8]
        dtype = getattr(torch, item[8]) if len(item) > 8 else None
        return OutputView(int(leaf), int(index), tuple(shape), tuple(stride), int(offset), tuple(base_shape),
                          tuple(base_stride), dtype)  # fmt: skip
    raise ValueError(f"unknown output record {tag!r}")


def _encode(value):
    """A constant output as JSON: [type, text]; None for values with no such form."""
    if value is None or isinstance(value, (bool, int, str)):
        return [type(value).__name__, value]
    if type(value) is float:
        return ["float", value.hex()]
    if isinstance(value, torch.Size):
        return ["Size", list(value)]
    if isinstance(value, torch.dtype):
        return ["dtype", str(value).removeprefix("torch.")]
    if isinstance(value, torch.device):
        return ["device", str(value)]
    return None


def _decode(encoded):
    tag, value = encoded
    if tag in ("NoneType", "bool", "int", "str"):
        return {"NoneType": lambda v: None, "bool": bool, "int": int, "str": str}[tag](value)
    if tag == "float":
        return float.fromhex(value)
    if tag == "Size":
        return torch.Size(int(v) for v in value)
    if tag == "dtype":
        dtype = getattr(torch, value)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{value!r} is not a dtype")
        return dtype
    if tag == "device":
        return torch.device(value)
    raise ValueError(f"unknown constant type {tag!r}")
