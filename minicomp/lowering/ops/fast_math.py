"""Faster forms of transcendental math where the result is rounded to 16 bits: `1 +- tanh(z)` as
a sigmoid, `1 +- erf(z)` as a fitted erfc. Used by the pointwise rules for add, sub and GELU.
"""

from __future__ import annotations

import torch

from minicomp.ir import Ref, dtypes
from minicomp.lowering.ops.core import Op, broadcast_index


def one_and(op: Op, sign: int) -> str | None:
    """`1 + f(z)`, `1 - f(z)`, `f(z) - 1` or `-1 - f(z)` for f = tanh or erf, written without the
    sum: `1 + tanh(z)` = `2 / (1 + exp(-2z))` (2 sigmoid(2z)), `1 - tanh(z)` = `2 / (1 + exp(2z))`;
    `1 + erf(z)` = `erfc(-z)`, `1 - erf(z)` = `erfc(z)` (`erfc16`), where the result is rounded to
    16 bits (the approximate exp and division, and the erfc fit, are within a few float32 ulps,
    far below a 16-bit rounding; float32 results keep eager's exact path). The same in real
    arithmetic, and

    - cheaper: libdevice's tanh and erf leave bfloat16 GELU bound by arithmetic, not memory;
      these forms take fewer instructions a value (benchmarks/experiments/gelu_sass.py);
    - better conditioned: where f(z) is within an ulp of -1 (or +1), the sum cancels and eager's
      own float32 result keeps few correct bits; these forms subtract nothing.

    The tanh (erf) node itself is not computed unless something else reads it.
    tests/e2e/test_fast_math.py checks every 16-bit input against the exact value and eager."""
    if not op.compute.is_floating_point or op.args.get("alpha") not in (None, 1):
        return None
    a, b = op.args.get("self"), op.args.get("other")
    for f, one, f_second in ((a, b, False), (b, a, True)):
        if not isinstance(f, Ref) or isinstance(one, Ref) or one not in (1, -1):
            continue
        node = op.graph[f.name]
        if node.op_name not in ("tanh", "erf") or f.name in op.writer.loads:
            continue
        if dtypes.compute_dtype(node.meta.dtype) != op.compute:
            continue
        if op.out_dtype not in dtypes.LOW_PRECISION or op.compute != torch.float32:
            continue  # a float32 (float64) result keeps libdevice's functions: eager's exact path
        # the value is s_one * (1 + f(z)) when the signs of f and 1 agree, else s_one * (1 - f(z))
        s_f = -1 if (sign < 0 and f_second) else 1
        s_one = one if f_second else one * sign
        inner = Op(node, op.graph, op.writer, broadcast_index(op.index, node.meta.shape), op.mask)
        z = op.temp(inner.operand("self"))
        plus = s_f == s_one
        if node.op_name == "tanh":
            value = f"libdevice.fast_dividef(2.0, 1.0 + tl.exp({'-2.0' if plus else '2.0'} * {z}))"
        else:
            value = erfc16(op, z, -1.0 if plus else 1.0)
        return value if s_one > 0 else f"{value} * -1.0"
    return None


# erfc(a) = t exp(P(t) - a^2), t = 1 / (1 + a / 2), a >= 0: Numerical Recipes' form (erfcc), its
# polynomial refitted at degree 5 for 16-bit results: relative error <= 1.5e-5 for a in [0, 10]
# evaluated in float32 (benchmarks/experiments/erfc_fit.py), under a bfloat16 (float16) half-ulp
# of 2e-3 (4.9e-4). Degree 9 reaches 1.2e-7; each degree is one multiply-add a value.
ERFC16 = (0.22879399, -0.70919989, 0.47450009, 0.25444219, 1.01801279, -1.26654155)
LOG2E = 1.4426950408889634


def erfc16(op: Op, x: str, scale: float) -> str:
    """erfc(scale * x), for a value rounded to 16 bits: relative error 1.5e-5 everywhere, tails
    included (GELU of -9 is -1e-19, not 0), in fewer instructions than libdevice's erf (`one_and`).
    The scale folds into t's multiply-add and the exponent's (the exponent in base 2, log2(e)
    folded into P); the division is the GPU's approximate one."""
    t = op.temp(f"libdevice.fast_dividef(1.0, 1.0 + {0.5 * abs(scale)!r} * tl.abs({x}))")
    poly = repr(ERFC16[0] * LOG2E)
    for c in ERFC16[1:]:  # Horner
        poly = f"{poly if '*' not in poly else f'({poly})'} * {t} {'+' if c >= 0 else '-'} {abs(c) * LOG2E!r}"
    r = op.temp(f"{t} * tl.exp2({poly} - {scale * scale * LOG2E!r} * {x} * {x})")
    return f"tl.where({x} {'>=' if scale > 0 else '<='} 0, {r}, 2.0 - {r})"
