"""A runtime integer as a loop bound under Triton's interpreter.

The interpreter holds a kernel's scalar argument as a numpy array of shape (1,) and patches
`tensor.__index__` to `int(array)`, which numpy 2.x refuses for an array that is not
0-dimensional ("only 0-dimensional arrays can be converted to Python scalars"). So
`for roffset in range(0, s0, RBLOCK)`, where a kernel family passes the row length `s0` at run
time (codegen/reduction.py), fails on the CPU while the compiled kernel runs on a GPU. `enable`
wraps the interpreter's patch so that `__index__` reads the one element (`.item()`)."""

from __future__ import annotations

import functools


def enable() -> None:
    """Make the interpreter's tensors index with their one element (idempotent)."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "_minicomp_index", False):
        return

    @functools.wraps(patch)
    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched._minicomp_index = True
    interpreter._patch_lang_tensor = patched
