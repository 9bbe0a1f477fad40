"""Checks inside kernels: what eager raises for (an index out of bounds, an integer division by
zero) is a device-side assert in the kernel, as Inductor writes one, and the call raises.

Kernels for CPU tensors carry them (lowering/ops/core.py `Op.check`). They run in Triton's
interpreter, whose `tl.device_assert` is a no-op unless its options say debug: `enable`
switches that on when a module for the interpreter is loaded (it affects nothing but
asserts: overflow sanitizing stays off), and `Launch` turns a failed check into the error eager raises (`CheckFailed`,
both an IndexError and a RuntimeError, as eager's gather raises one and cross_entropy the
other). CUDA kernels carry the bounds checks only (eager's CUDA kernels assert an index too, but
do not raise for a division by zero): a kernel with one is launched with `checked=True`,
compiled with COMPILE_OPTIONS (as Inductor compiles its kernels), and a failed check is CUDA's
"device-side assert triggered", as in eager. Kernels without checks compile as before.
"""

from __future__ import annotations

import dataclasses

PREFIX = "minicomp check: "  # starts the message of every check a kernel makes
# Triton's options for a CUDA kernel with checks: its asserts compiled in (debug), without the
# integer overflow asserts debug would also add (integers wrap, as in eager)
COMPILE_OPTIONS = {"debug": True, "sanitize_overflow": False}


class CheckFailed(IndexError, RuntimeError):
    """A check in a kernel failed: what eager raises as an IndexError or a RuntimeError."""


def enable() -> None:
    """Make Triton's interpreter evaluate `tl.device_assert` (it skips them unless debug is on),
    without the integer overflow asserts debug would also add: integers wrap, as in eager."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug or builder.options.sanitize_overflow:
        builder.options = dataclasses.replace(builder.options, debug=True, sanitize_overflow=False)


def failed(error: BaseException) -> CheckFailed | None:
    """The error to raise for an interpreter error that is a failed check, else None."""
    cause = error.__cause__
    if isinstance(cause, AssertionError) and str(cause).startswith(PREFIX):
        return CheckFailed(str(cause).removeprefix(PREFIX))
    return None
