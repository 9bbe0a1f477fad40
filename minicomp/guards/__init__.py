"""Guards: when a compiled entry may serve a call.

key.py          the signature key: arguments, global modes, the Python values a function reads
checks.py       what is checked on a call instead, and what a trace refuses and why
reads.py        what a function reads besides its arguments (globals, cells, helpers)
read_keys.py    their keys call after call, reused where they cannot have changed
context.py      a function's Python context: watched while tracing, undone on failure
fingerprint.py  a function's code and reads as a hash, for the disk cache
"""

from minicomp.guards.checks import (
    ConstantNeedsGrad,
    GradHook,
    GradModeInside,
    NumberFromValues,
    OutDtype,
    ReadsValues,
    SideEffect,
    TraceStopped,
    Unguarded,
    any_shared,
    constants_need_grad,
    grad_watched,
    refuse_grad_constants,
    refuse_numbers_from_values,
    shares_memory,
    versions,
)
from minicomp.guards.key import (
    INSIDE_A_TRACE,
    PLAIN,
    SAME_OBJECT,
    TENSOR_FIELDS,
    ByIdentity,
    SignatureKey,
    Unguardable,
    Unusual,
    contains,
    describe_change,
    describe_state,
    global_state,
    in_functorch_transform,
    leaf_key,
    state_key,
    unguardable,
    unusual,
    user_object,
    value_key,
)

__all__ = [
    "INSIDE_A_TRACE",
    "PLAIN",
    "SAME_OBJECT",
    "TENSOR_FIELDS",
    "ByIdentity",
    "ConstantNeedsGrad",
    "GradHook",
    "GradModeInside",
    "NumberFromValues",
    "ReadsValues",
    "OutDtype",
    "SideEffect",
    "SignatureKey",
    "TraceStopped",
    "Unguardable",
    "Unguarded",
    "Unusual",
    "any_shared",
    "constants_need_grad",
    "contains",
    "describe_change",
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
