"""The currency of lowering: `Value`, the `Op` a rule sees, and the rule registries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from minicomp.ir import Graph, Node, Ref, dtypes
from minicomp.ir.dtypes import literal
from minicomp.lowering.indexing import Expr, const
from minicomp.runtime import checks


@dataclass(frozen=True)
class Value:
    """A value inside a kernel: Triton source text and the dtype it is held in.

    `dtype is None` marks a Python scalar (a literal that takes the other
    operand's type, as in PyTorch); `py` keeps its Python value.
    """

    code: str
    dtype: torch.dtype | None
    py: object = None


class Writer(Protocol):
    """What lowering rules need from the kernel writer (codegen/kernel.py): values at an index,
    index text, comparisons, helper lines, and the tile every value has (`[BLOCK_SIZE]` in a
    pointwise kernel), so one rule serves every kernel kind."""

    tile: str

    def tile_for(self, index: tuple[Expr, ...]) -> str: ...
    def is_full(self, index: tuple[Expr, ...]) -> bool: ...
    def value(self, name: str, index: tuple[Expr, ...], mask: tuple[str, ...]) -> Value: ...
    def temp(self, code: str, dtype: torch.dtype, hint: str) -> Value: ...
    def index_text(self, expr: Expr) -> str: ...
    def load_mask(self, index: tuple[Expr, ...], mask: tuple[str, ...]) -> str: ...
    def compare(self, expr: Expr, relation: str, bound: int) -> str | bool: ...


Condition = str | bool  # source text of a bool block, or a value known when the kernel is written


def all_of(conditions) -> Condition:
    """The conjunction: False if any is, True if all are, else the undecided ones joined by &."""
    conditions = list(conditions)
    if any(c is False for c in conditions):
        return False
    texts = [c for c in conditions if c is not True]
    return " & ".join(texts) if texts else True


def cast(v: Value, dtype: torch.dtype) -> str:
    """Source of `v` converted to `dtype` (literals are written in it directly)."""
    if v.dtype is None:
        return literal(v.py, dtype)
    if v.dtype == dtype:
        return v.code
    if dtype == torch.bool:
        return f"({v.code} != 0)"
    if dtype in dtypes.LOW_PRECISION and v.dtype != torch.float32:
        # through float32, as eager converts (c10's Half and BFloat16 are made from a float: a
        # float64 rounds twice, 1 + 2**-8 + 2**-40 -> bfloat16 1.0), and Triton's interpreter turns
        # an int64 or float64 -> bfloat16 into garbage
        return f"{v.code}.to(tl.float32).to({dtypes.triton_dtype(dtype)})"
    if dtype == torch.uint8 and v.dtype.is_floating_point:
        # through int64, as eager converts (c10's cast to uint8): -1.5 -> 255, where Triton saturates to 0
        return f"{v.code}.to(tl.int64).to(tl.uint8)"
    return f"{v.code}.to({dtypes.triton_dtype(dtype)})"


def bitcast(v: Value, source: torch.dtype, dtype: torch.dtype) -> str:
    """Source of the bits of `v`, a value of `source` (held in its compute dtype), read as `dtype`
    of the same size: `view(dtype)` reinterprets, it does not convert (float32 1.0 -> 1065353216)."""
    if v.dtype is None:
        code = f"tl.full([], {literal(v.py, source)}, {dtypes.triton_dtype(source)})"
    else:
        code = v.code if v.dtype == source else f"{v.code}.to({dtypes.triton_dtype(source)})"
    code = f"{code}.to({dtypes.triton_dtype(dtype)}, bitcast=True)"
    return f"{code}.to(tl.float32)" if dtype in dtypes.LOW_PRECISION else code


def broadcast_index(index: tuple[Expr, ...], shape: tuple[int, ...]) -> tuple[Expr, ...]:
    """Index of a broadcast operand of `shape` (PyTorch broadcasting rules)."""
    tail = index[len(index) - len(shape) :] if shape else ()
    return tuple(const(0) if size == 1 else e for e, size in zip(tail, shape))


def bind(node: Node) -> dict:
    """Node arguments by schema name, defaults filled in."""
    schema = node.target._schema
    bound = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for arg, value in zip(positional, node.args):
        bound[arg.name] = value
    bound.update(node.kwargs)
    for arg in schema.arguments:
        if arg.name not in bound and arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


class Op:
    """One node being lowered at one index: its operands, params and dtypes."""

    def __init__(self, node: Node, graph: Graph, writer: Writer, index, mask):
        self.node, self.graph, self.writer = node, graph, writer
        self.index, self.mask = index, mask
        self.args = bind(node)
        self.out_dtype = node.meta.dtype
        self.compute = dtypes.compute_dtype(self.out_dtype)

    def param(self, name: str):
        return self.args.get(name)

    @property
    def tile(self) -> str:
        """The shape of this node's value in the kernel, as Triton source (`tl.full(op.tile, ...)`):
        `[BLOCK_SIZE]` in a pointwise kernel; a reduction kernel's rows are `[XBLOCK, 1]`."""
        return self.writer.tile_for(self.index)

    def value(self, name: str, index=None, mask=None) -> Value:
        """The operand named `name` as a Value, broadcast to this node's index."""
        arg = self.args[name]
        if not isinstance(arg, Ref):
            arg = self.scalar(name)
            return Value(literal(arg), None, arg)
        meta = self.graph[arg.name].meta
        index = broadcast_index(self.index, meta.shape) if index is None else index
        return self.writer.value(arg.name, index, self.mask if mask is None else mask)

    def scalar(self, name: str):
        """The Python scalar argument `name` as eager uses it. On the CPU a float meeting a 16-bit
        tensor is first rounded to that dtype, except by mul and div, which keep it (`half + 3.3`
        rounds 3.3 to half, `half * 3.3` does not); eager's CUDA kernels keep it in float32 for
        every op. Both checked in tests/guards/test_trust.py."""
        value = self.args[name]
        if (
            isinstance(value, float)
            and self.out_dtype in dtypes.LOW_PRECISION
            and self.node.meta.device.type == "cpu"
            and self.node.op_name not in KEEPS_SCALAR
        ):
            return dtypes.round_to(value, self.out_dtype)
        return value

    def operand(self, name: str, dtype: torch.dtype | None = None) -> str:
        """The operand's source, cast to `dtype` (default: this op's compute dtype). By default a
        tensor operand of another dtype than a 16-bit result is first rounded to the result's
        dtype, as eager converts every operand to the common dtype: `bf16 - f16_0d` subtracts the
        0-d value rounded to bfloat16 (unrounded, `x - x` of a stored and an unstored copy of it
        was not 0, and a gradient through sqrt(|x - x|) came out finite where eager's is nan)."""
        value = self.value(name)
        if dtype is None:
            value = self.converted(name, value, self.out_dtype)
        return cast(value, dtype or self.compute)

    def converted(self, name: str, value: Value, common: torch.dtype) -> Value:
        """`value` of tensor operand `name` as eager sees it converted to the operands' `common`
        dtype: rounded to it where it is 16-bit and the operand's own dtype another (held in
        float32), else as it is."""
        arg = self.args[name]
        if common not in dtypes.LOW_PRECISION or not isinstance(arg, Ref):
            return value
        if self.graph[arg.name].meta.dtype in (common, torch.bool):
            return value
        return Value(f"{cast(value, common)}.to(tl.float32)", torch.float32)

    def promoted(self, *names: str) -> torch.dtype:
        """PyTorch's promoted dtype of the operands (what comparisons compare in: a float32 0-d
        tensor meeting a bfloat16 one is rounded to bfloat16 first)."""
        dummies = []
        for name in names:
            arg = self.args[name]
            if isinstance(arg, Ref):
                meta = self.graph[arg.name].meta
                dummies.append(torch.empty((1,) * min(meta.ndim, 1), dtype=meta.dtype, device="meta"))
            else:
                dummies.append(arg)
        return torch.result_type(*dummies)

    def compare(self, expr: Expr, relation: str, bound: int) -> Condition:
        """`expr <relation> bound` for relation in >=, <, ==: True or False where the kernel
        text decides it (codegen/parts.py), else its source."""
        return self.writer.compare(expr, relation, bound)

    def check(self, condition: str, error: str, index=None, mask=None, cuda: bool = True) -> None:
        """A device-side assert that `condition` holds in every lane of this node's value (or of
        the value at `index` under `mask`): where it fails, the call raises `error`
        (runtime/checks.py), where eager raises (an index out of bounds, an integer division by
        zero). A lane past the tensor's end is not checked. A CUDA kernel carries it too, as
        eager's CUDA kernels assert an index (and as Inductor's kernels do: its launch compiles
        it with Triton's debug option, codegen/module.py), unless `cuda=False`: a check eager's
        CUDA kernels do not make (a division by zero returns a value there)."""
        if self.node.meta.device.type != "cpu" and not cuda:
            return
        lanes = self.writer.load_mask(self.index if index is None else index, self.mask if mask is None else mask)
        where = f", mask={lanes}" if lanes else ""
        message = f"{checks.PREFIX}{error}".replace('"', "'")
        self.writer.temp(f'tl.device_assert({condition}, "{message}"{where})', torch.bool, f"{self.node.name}_check")

    def temp(self, code: str, dtype: torch.dtype | None = None) -> str:
        """A helper line `<node>_tmp = code` (for values a rule uses more than once)."""
        if code.isidentifier():
            return code
        return self.writer.temp(code, dtype or self.compute, f"{self.node.name}_tmp").code


KEEPS_SCALAR = {"mul", "div"}  # ops whose eager CPU kernels use a scalar unrounded (Op.scalar)
Rule = Callable[[Op], str]
POINTWISE: dict[str, Rule] = {}
VIEWS: dict[str, Callable[[Op, tuple], tuple[str, tuple]]] = {}
INDEXED: dict[str, Rule] = {}
SPECIAL_SUPPORT: dict[str, Callable[[Node, Graph], bool]] = {}  # ops that fuse only for some arguments


def _registrar(table: dict):
    def decorator(*names: str):
        def register(fn):
            for name in names:
                table[name] = fn
            return fn

        return register

    return decorator


pointwise = _registrar(POINTWISE)  # @pointwise("add") def add(op) -> source of add
view = _registrar(VIEWS)  # @view("permute") def permute(op, index) -> (input, its index)
indexed = _registrar(INDEXED)  # @indexed("cat") def cat(op) -> source of the gathered value
