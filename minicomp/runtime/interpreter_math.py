"""numpy stand-ins for Triton's libdevice under the interpreter (CPU tensors).

Triton's interpreter runs kernels in numpy but cannot call libdevice (extern
functions): `libdevice.tanh(x)` fails there. Generated modules import the real
libdevice; when one is loaded for CPU tensors, the runtime rebinds its
`libdevice` global to this namespace. Each function takes the interpreter's
tl.tensor (numpy data inside) and returns one of the same dtype.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.interpreter import TensorHandle


def _data(x):
    return x.handle.data if isinstance(x, tl.tensor) else np.asarray(x)


def _elementwise(np_fn):
    def apply(*args):
        like = next(a for a in args if isinstance(a, tl.tensor))
        with np.errstate(all="ignore"):
            data = np_fn(*[_data(a) for a in args])
        data = np.asarray(data).astype(like.handle.data.dtype)
        return tl.tensor(TensorHandle(data, like.handle.dtype.scalar), like.type)

    apply.__name__ = getattr(np_fn, "__name__", "fn")
    return apply


_erfc = np.vectorize(math.erfc, otypes=[np.float64])

libdevice = SimpleNamespace(
    **{
        name: _elementwise(fn)
        for name, fn in {
            "tanh": np.tanh,
            "log1p": np.log1p,
            "expm1": np.expm1,
            "log10": np.log10,
            "sqrt": np.sqrt,
            "rsqrt": lambda x: 1.0 / np.sqrt(x),
            "tan": np.tan,
            "asin": np.arcsin,
            "acos": np.arccos,
            "atan": np.arctan,
            "sinh": np.sinh,
            "cosh": np.cosh,
            "asinh": np.arcsinh,
            "acosh": np.arccosh,
            "atanh": np.arctanh,
            "erfc": _erfc,
            "trunc": np.trunc,
            "nearbyint": np.rint,
            "pow": np.power,
            "atan2": np.arctan2,
            "hypot": np.hypot,
            "fast_dividef": np.divide,  # the GPU's approximate division (2 ulp); exact here
        }.items()
    }
)


def float32_to_bfloat16_bits(data: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) as uint16 bit patterns."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(data)
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def _round_bfloat16_to_nearest_even() -> None:
    """Triton 3.6's interpreter truncates float32 -> bfloat16 (and its own
    round-to-nearest path drops the mantissa carry); GPUs round to nearest
    even. Make the interpreter agree with the GPU."""
    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_minicomp_rtne", False):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = float32_to_bfloat16_bits(src.data)
            return TensorHandle(bits.view(interpreter._get_np_dtype(dst_type)), dst_type.scalar)
        return original(self, src, dst_type)

    cast_impl._minicomp_rtne = True
    builder.cast_impl = cast_impl


_round_bfloat16_to_nearest_even()
