"""Guards: when a compiled entry may serve a call.

key.py          the signature key: arguments, global modes, what is refused and why
reads.py        what a function reads besides its arguments (globals, cells, helpers)
context.py      a function's Python context: watched while tracing, undone on failure
fingerprint.py  a function's code and reads as a hash, for the disk cache
"""

from minicomp.guards.key import (
    INSIDE_A_TRACE,
    PLAIN,
    SAME_OBJECT,
    ByIdentity,
    ConstantNeedsGrad,
    GradHook,
    NumberFromValues,
    SideEffect,
    Unguardable,
    Unguarded,
    Unusual,
    constants_need_grad,
    contains,
    describe_state,
    global_state,
    grad_watched,
    in_functorch_transform,
    leaf_key,
    refuse_grad_constants,
    refuse_numbers_from_values,
    shares_memory,
    state_key,
    unguardable,
    unusual,
    user_object,
    value_key,
    versions,
)

__all__ = [
    "INSIDE_A_TRACE",
    "PLAIN",
    "SAME_OBJECT",
    "ByIdentity",
    "ConstantNeedsGrad",
    "GradHook",
    "NumberFromValues",
    "SideEffect",
    "Unguardable",
    "Unguarded",
    "Unusual",
    "constants_need_grad",
    "contains",
    "describe_state",
    "global_state",
    "grad_watched",
    "in_functorch_transform",
    "leaf_key",
    "refuse_grad_constants",
    "refuse_numbers_from_values",
    "shares_memory",
    "state_key",
    "unguardable",
    "unusual",
    "user_object",
    "value_key",
    "versions",
]
