"""Pointwise lowering rules: ATen op -> Triton expression of its operands."""

from __future__ import annotations

import torch

from minicomp.ir import Graph, Node, Ref, dtypes
from minicomp.ir.dtypes import literal
from minicomp.lowering.ops.core import (
    POINTWISE,
    SPECIAL_SUPPORT,
    Op,
    Rule,
    Value,
    bind,
    cast,
    pointwise,
)
from minicomp.lowering.ops.fast_math import erfc16, one_and

NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"


# -- pointwise: simple tables ------------------------------------------------

# float functions of one operand; ints and bools are converted to float first.
# (tl.sigmoid is a @triton.jit library function, which the interpreter cannot
# call from a kernel imported in compiled mode: it is spelled out instead.)
UNARY_FLOAT = {
    "exp": "tl.exp({})",
    "exp2": "tl.exp2({})",
    "log": "tl.log({})",
    "log2": "tl.log2({})",
    "sin": "tl.sin({})",
    "cos": "tl.cos({})",
    "erf": "tl.erf({})",
    "sigmoid": "1.0 / (1.0 + tl.exp(-{}))",
    "log10": "libdevice.log10({})",
    "log1p": "libdevice.log1p({})",
    "expm1": "libdevice.expm1({})",
    "sqrt": "libdevice.sqrt({})",
    "rsqrt": "libdevice.rsqrt({})",
    "tan": "libdevice.tan({})",
    "tanh": "libdevice.tanh({})",
    "asin": "libdevice.asin({})",
    "acos": "libdevice.acos({})",
    "atan": "libdevice.atan({})",
    "sinh": "libdevice.sinh({})",
    "cosh": "libdevice.cosh({})",
    "asinh": "libdevice.asinh({})",
    "acosh": "libdevice.acosh({})",
    "atanh": "libdevice.atanh({})",
    "reciprocal": "1.0 / {}",
    "erfc": "libdevice.erfc({})",
}
# functions of one operand that keep its dtype (identity on integers where noted).
UNARY_SAME = {
    "abs": "tl.abs({})",
    "relu": "tl.where({0} < 0, 0, {0})",
    "floor": "tl.floor({})",
    "ceil": "tl.ceil({})",
    "trunc": "libdevice.trunc({})",
}
ROUNDING = {"floor", "ceil", "trunc"}  # identity on integer tensors
BINARY = {
    "mul": "{} * {}",
    "atan2": "libdevice.atan2({}, {})",
    "hypot": "libdevice.hypot({}, {})",
    "bitwise_and": "{} & {}",
    "bitwise_or": "{} | {}",
    "bitwise_xor": "{} ^ {}",
}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}


def _unary_float(template: str) -> Rule:
    return lambda op: template.format(op.operand("self"))


def _unary_same(name: str, template: str) -> Rule:
    def rule(op: Op) -> str:
        x = op.operand("self")
        if name in ROUNDING and not op.compute.is_floating_point:
            return x
        if name == "abs" and op.compute == torch.bool:
            return x
        return template.format(x)

    return rule


def _binary(template: str) -> Rule:
    def rule(op: Op) -> str:
        a, b = op.operand("self"), op.operand("other")
        if template == "{} * {}" and op.compute == torch.bool:
            return f"{a} & {b}"
        return template.format(a, b)

    return rule


def _compare(symbol: str) -> Rule:
    def rule(op: Op) -> str:
        common = op.promoted("self", "other")
        return f"{_rounded(op, 'self', common)} {symbol} {_rounded(op, 'other', common)}"

    return rule


def _rounded(op: Op, name: str, common: torch.dtype) -> str:
    """An operand of a comparison as eager compares it: as stored (`_as_stored`: a backward's
    `amin == sin(x)` recomputed sin unrounded against the stored, rounded amin: no element was
    equal, and its gradient was 0 / 0), then converted to the operands' `common` dtype (a float32
    0-d tensor meeting bfloat16 values is rounded to bfloat16: maximum's backward found ties
    there), held in its compute dtype."""
    return cast(op.converted(name, _as_stored(op, name), common), dtypes.compute_dtype(common))


def _as_stored(op: Op, name: str) -> Value:
    """The operand as eager stores it: a 16-bit value a kernel holds in float32 rounded to its
    dtype (still held in float32). Continuous ops take it unrounded (minicomp rounds once, at the
    store); comparisons and casts to integers, which jump at a boundary, take it rounded."""
    value, arg = op.value(name), op.args[name]
    if isinstance(arg, Ref) and value.dtype == torch.float32:
        own = op.graph[arg.name].meta.dtype
        if own in dtypes.LOW_PRECISION:
            return Value(f"{value.code}.to({dtypes.triton_dtype(own)}).to(tl.float32)", torch.float32)
    return value


def _logical(symbol: str) -> Rule:
    return lambda op: f"{op.operand('self', torch.bool)} {symbol} {op.operand('other', torch.bool)}"


for _name, _t in UNARY_FLOAT.items():
    POINTWISE[_name] = _unary_float(_t)
for _name, _t in UNARY_SAME.items():
    POINTWISE[_name] = _unary_same(_name, _t)
for _name, _t in BINARY.items():
    POINTWISE[_name] = _binary(_t)
for _name, _s in COMPARE.items():
    POINTWISE[_name] = _compare(_s)
for _name, _s in LOGICAL.items():
    POINTWISE[_name] = _logical(_s)


# -- pointwise: rules with a little logic ----------------------------------------


@pointwise("neg")
def neg(op: Op) -> str:
    """Triton's unary minus is `0 - x`, which makes -(+0.0) +0.0: floats multiply by -1 instead."""
    x = op.operand("self")
    return f"{x} * -1.0" if op.compute.is_floating_point else f"-{x}"


@pointwise("fmax", "fmin")
def fmax(op: Op) -> str:
    """The larger (smaller) operand, NaN only where both are NaN: spelled out, because
    `tl.maximum` without propagate_nan leaves NaN to the backend (numpy propagates it)."""
    a, b = op.temp(op.operand("self")), op.temp(op.operand("other"))
    fn = "tl.maximum" if op.node.op_name == "fmax" else "tl.minimum"
    if not op.compute.is_floating_point:
        return f"{fn}({a}, {b})"
    return f"tl.where({a} != {a}, {b}, tl.where({b} != {b}, {a}, {fn}({a}, {b})))"


def _scaled(op: Op, name: str) -> str:
    alpha = op.scalar("alpha") if op.args.get("alpha") is not None else None
    x = op.operand(name)
    return x if alpha in (None, 1) else f"{x} * {literal(alpha, op.compute)}"


@pointwise("add")
def add(op: Op) -> str:
    if op.compute == torch.bool:
        return f"{op.operand('self')} | {op.operand('other')}"
    return one_and(op, +1) or f"{op.operand('self')} + {_scaled(op, 'other')}"


@pointwise("sub")
def sub(op: Op) -> str:
    return one_and(op, -1) or f"{op.operand('self')} - {_scaled(op, 'other')}"


def _no_zero_divisor(op: Op, b: str) -> None:
    """An integer division by zero raises in eager on the CPU ("ZeroDivisionError"), so it does here
    (Op.check; a literal divisor is decided now). Eager's CUDA kernels return a value: none there."""
    other = op.args["other"]
    if op.compute.is_floating_point or (not isinstance(other, Ref) and op.scalar("other") != 0):
        return
    op.check(f"{b} != 0", "ZeroDivisionError", cuda=False)


@pointwise("div")
def div(op: Op) -> str:
    a, b = op.operand("self"), op.operand("other")
    mode = op.param("rounding_mode")
    if mode is None:
        return f"{a} / {b}"
    _no_zero_divisor(op, b)
    if op.compute.is_floating_point:
        return f"tl.floor({a} / {b})" if mode == "floor" else f"libdevice.trunc({a} / {b})"
    if mode == "trunc":
        return f"{a} // {b}"  # Triton's integer // truncates, like C
    return _int_floor_div(op, a, b)


def _int_floor_div(op: Op, a: str, b: str) -> str:
    a, b = op.temp(a), op.temp(b)
    q = op.temp(f"{a} // {b}")
    return f"tl.where(({a} % {b} != 0) & (({a} < 0) != ({b} < 0)), {q} - 1, {q})"


@pointwise("remainder")
def remainder(op: Op) -> str:
    a, b = op.temp(op.operand("self")), op.temp(op.operand("other"))
    _no_zero_divisor(op, b)
    r = op.temp(f"{a} % {b}")  # C-style: sign of a; PyTorch wants the sign of b
    return f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})"


@pointwise("fmod")
def fmod(op: Op) -> str:
    b = op.operand("other")
    _no_zero_divisor(op, b)
    return f"{op.operand('self')} % {b}"


@pointwise("maximum", "minimum")
def maximum(op: Op) -> str:
    fn = "tl.maximum" if op.node.op_name == "maximum" else "tl.minimum"
    nan = f", {NAN_ALL}" if op.compute.is_floating_point else ""
    return f"{fn}({op.operand('self')}, {op.operand('other')}{nan})"


@pointwise("clamp", "clamp_min", "clamp_max")
def clamp(op: Op) -> str:
    """clamp(x, min, max), clamp_min(x, min), clamp_max(x, max): NaN in any operand gives NaN, as eager."""
    x = op.operand("self")
    nan = f", {NAN_ALL}" if op.compute.is_floating_point else ""
    if op.args.get("min") is not None:
        x = f"tl.maximum({x}, {op.operand('min')}{nan})"
    if op.args.get("max") is not None:
        x = f"tl.minimum({x}, {op.operand('max')}{nan})"
    return x


@pointwise("where")
def where(op: Op) -> str:
    return f"tl.where({op.operand('condition', torch.bool)}, {op.operand('self')}, {op.operand('other')})"


@pointwise("logical_not")
def logical_not(op: Op) -> str:
    return f"{op.operand('self', torch.bool)} == 0"


@pointwise("bitwise_not")
def bitwise_not(op: Op) -> str:
    x = op.operand("self")
    return f"{x} == 0" if op.compute == torch.bool else f"~{x}"


@pointwise("isnan")
def isnan(op: Op) -> str:
    x = op.value("self")
    return f"{x.code} != {x.code}" if x.dtype.is_floating_point else "0"


@pointwise("sign")
def sign(op: Op) -> str:
    x = op.temp(op.operand("self"))
    if op.compute == torch.bool:
        return x
    return f"({x} > 0).to({dtypes.triton_dtype(op.compute)}) - ({x} < 0).to({dtypes.triton_dtype(op.compute)})"


@pointwise("pow")
def pow_(op: Op) -> str:
    base, exponent = op.value("self"), op.value("exponent")
    if exponent.dtype is None:  # Tensor_Scalar: unroll small integer powers
        e = exponent.py
        x = op.temp(cast(base, op.compute))
        if float(e).is_integer() and 0 <= e <= 4:
            return " * ".join([x] * int(e)) or literal(1, op.compute)
        if e == 0.5:
            return f"libdevice.sqrt({x})"
        if e == -1:
            return f"1.0 / {x}"
        return f"libdevice.pow({x}, {literal(e, op.compute)})"
    if base.dtype is None and base.py == 2:
        return f"tl.exp2({cast(exponent, op.compute)})"
    return f"libdevice.pow({cast(base, op.compute)}, {cast(exponent, op.compute)})"


def _pow_supported(node: Node, graph: Graph) -> bool:
    """Integer powers run in-kernel only with a small constant exponent."""
    if node.meta.dtype.is_floating_point:
        return True
    exponent = bind(node).get("exponent")
    return isinstance(exponent, (int, float)) and float(exponent).is_integer() and 0 <= exponent <= 4


@pointwise("gelu")
def gelu(op: Op) -> str:
    x = op.temp(op.operand("self"))
    fast = op.out_dtype in dtypes.LOW_PRECISION  # see one_and
    if op.param("approximate") == "tanh":
        inner = op.temp(f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})")
        if fast:  # 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u))
            return f"libdevice.fast_dividef({x}, 1.0 + tl.exp(-2.0 * {inner}))"
        return f"0.5 * {x} * (1.0 + libdevice.tanh({inner}))"
    if fast:  # 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)
        return f"0.5 * {x} * {erfc16(op, x, -0.7071067811865476)}"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


@pointwise("_to_copy", "convert_element_type")
def to_copy(op: Op) -> str:
    """The cast is the whole op. A cast to float16/bfloat16 rounds there, as in
    eager, even though the value then lives on in float32."""
    source = "self" if "self" in op.args else "a"  # prims.convert_element_type names it `a`
    if op.out_dtype in dtypes.LOW_PRECISION:
        return f"{op.operand(source, op.out_dtype)}.to(tl.float32)"
    if not op.out_dtype.is_floating_point:  # truncation jumps at integers: from the stored value
        return cast(_as_stored(op, source), op.compute)
    return op.operand(source)


@pointwise("copy")
def copy(op: Op) -> str:
    return op.operand("src")


@pointwise("full", "full_like", "scalar_tensor", "fill")
def full(op: Op) -> str:
    name = "fill_value" if "fill_value" in op.args else "value" if op.args.get("value") is not None else "s"
    value = op.scalar(name)
    return f"tl.full({op.tile}, {literal(value, op.compute)}, {dtypes.triton_dtype(op.compute)})"


@pointwise("arange")
def arange(op: Op) -> str:
    start, step = op.param("start") or 0, op.param("step") or 1
    dtype = dtypes.triton_dtype(op.compute)
    if op.index[0].is_const:
        return f"tl.full({op.tile}, {literal(start + step * op.index[0].const, op.compute)}, {dtype})"
    i = op.writer.index_text(op.index[0])
    if op.compute == torch.int64:  # the index is int32: widen before multiplying (2**30 steps overflow)
        return f"({i}).to(tl.int64) * {literal(step, op.compute)} + {literal(start, op.compute)}"
    return f"({literal(start, op.compute)} + {i} * {literal(step, op.compute)}).to({dtype})"


@pointwise("round")
def round_(op: Op) -> str:
    """Half to even, like torch.round; with decimals, at a scaled position."""
    x = op.operand("self")
    if not op.compute.is_floating_point:
        return x
    decimals = op.param("decimals") or 0
    if decimals == 0:
        return f"libdevice.nearbyint({x})"
    if decimals > 0:
        return f"libdevice.nearbyint({x} * {10.0**decimals}) / {10.0**decimals}"
    return f"libdevice.nearbyint({x} / {10.0**-decimals}) * {10.0**-decimals}"


SPECIAL_SUPPORT["pow"] = _pow_supported
