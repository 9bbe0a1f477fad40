"""The fallback policy, in one place: what happens when minicomp cannot compile something.

    "warn"    run it eagerly (or as Dynamo captured it), with one warning (the default)
    "silent"  the same, without the warning
    "raise"   raise `CompileError`, chained to the cause

`minicomp.jit(fallback=...)` or MINICOMP_FALLBACK (config.py) choose it; both
`JitFunction` and the Dynamo backend call `handle`.
"""

from __future__ import annotations

import warnings

from minicomp import guards, ir


class CompileError(RuntimeError):
    """minicomp could not compile a function (raised when fallback="raise")."""


def describe(name: str, err: Exception) -> str:
    """Why `name` did not compile, and what the user can do about it (one sentence)."""
    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    if "data-dependent" in text or "GuardOnDataDependent" in type(err).__name__:
        why = (
            "it branches on tensor values (e.g. `if x.sum() > 0`), which a trace cannot follow. "
            "Use torch.where for the branch, decide it from shapes or Python arguments, or keep that "
            "part outside the jitted function"
        )
    elif isinstance(err, ir.SymbolicSize):
        why = text
    elif "DynamicOutputShape" in type(err).__name__:
        why = (
            "an op's output shape depends on tensor values (nonzero, unique, masked indexing), "
            "which minicomp compiles only for static shapes. Keep that op outside the jitted function"
        )
    elif "mutating a non-functional tensor with a functional tensor" in text:  # PyTorch's internal assert
        why = (
            "it writes in place into a tensor it closes over (or a view of one), which compiled code "
            "would not repeat: pass that tensor as an argument, or keep the write outside the jitted function"
        )
    elif isinstance(err, guards.REFUSALS):
        why = text
    else:
        why = f"{type(err).__name__}: {first}"
    return f"minicomp could not compile {name}: {why}."


def handle(name: str, err: Exception, policy: str, instead: str = "Running it eagerly.", stacklevel: int = 2) -> None:
    """Apply `policy` to a failure to compile `name`: raise CompileError, warn, or say nothing.
    The caller then runs the code the way `instead` says."""
    why = describe(name, err)
    if policy == "raise":
        raise CompileError(
            f"{why} With fallback='warn' (the default) or MINICOMP_FALLBACK=warn it runs eagerly instead."
        ) from err
    if policy == "warn":
        warnings.warn(f"{why} {instead}", stacklevel=stacklevel + 1)
