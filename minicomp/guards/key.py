"""The signature key: what a compiled entry assumes, held by the key a call looks it up with.

A compiled entry is valid only under what its trace saw. The signature key of
a call (`SignatureKey`, built by dispatch/function.py) holds all of it:

  * each argument leaf (`leaf_key`): a tensor's shape, stride, dtype, device and
    requires_grad; a Python value by its value, floats by their bits (so -0.0 is
    not 0.0 and NaN equals NaN); a numpy array by its contents; a function or
    class by identity; anything else is an object minicomp cannot watch, and
    that signature runs eagerly (`Unguardable`);
  * the global modes that change what a trace records (`global_state`): grad
    mode, inference mode, autocast (per device type, with its dtype), the
    default dtype, deterministic algorithms, and active torch function or
    dispatch modes (which is how a default device is set);
  * the Python values the function reads besides its arguments (`state_key` of
    each place `reads.Reads` lists: its globals, closure cells, those of the user
    functions it calls, attributes of a config object); for `jit(module)` also
    every submodule's training flag and plain attributes (dispatch/modules.py
    `ModuleContext`).

What costs nothing unless an entry needs it is checked on a call instead
(checks.py), and a trace that changes Python state is undone (context.py).

Keys that hold an object's identity (`ByIdentity`) are never persisted: an
address means nothing in another process.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import types
from typing import NamedTuple

import numpy as np
import torch

from minicomp.guards import reads


class SignatureKey(NamedTuple):
    """Everything a compiled entry assumes about a call (a tuple: it hashes and compares as one).

    A call looks its entry up with a plain tuple of these four fields (dispatch/function.py
    `_key`): it equals the SignatureKey stored when the signature was compiled and hashes the
    same, and is cheaper to build on every call."""

    structure: object  # the arguments' structure: their count (all positional, no container) or a TreeSpec
    leaves: tuple  # leaf_key of each flattened argument
    modes: tuple  # global_state(): grad, inference, default dtype, deterministic, autocast, torch modes
    context: tuple | None  # the function's context's state() (what it reads); None when it reads nothing


_BY_VALUE = (
    type(None),
    bool,
    int,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    type(Ellipsis),
    range,
)
IMMUTABLE = frozenset((*_BY_VALUE, float, complex))  # a value keyed by value that cannot change in place
_BY_IDENTITY = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    type,
    types.ModuleType,
    torch._ops.OpOverload,
    torch._ops.OpOverloadPacket,
)


class ByIdentity:
    """A key part equal only to the same object (functions, classes, tensor attributes)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, ByIdentity) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)

    def __repr__(self):
        return f"<identity of {type(self.obj).__name__} {getattr(self.obj, '__qualname__', '')}>"


class Unguardable(ByIdentity):
    """An argument minicomp cannot watch for changes: its signature runs eagerly."""

    __slots__ = ()

    def __repr__(self):
        return f"<{type(self.obj).__name__} object>"


_PLAIN_TENSORS = {torch.Tensor, torch.nn.Parameter}
TENSOR_FIELDS = ("shape", "stride", "dtype", "device", "requires_grad")  # a plain tensor's leaf_key


def leaf_key(value):
    """What one flattened argument contributes to the signature key (a plain tensor: TENSOR_FIELDS)."""
    if isinstance(value, torch.Tensor):
        if type(value) in _PLAIN_TENSORS and not (value.is_neg() or value.is_conj()):
            try:
                return (value.shape, value.stride(), value.dtype, value.device, value.requires_grad)
            except RuntimeError:  # a nested tensor has no strides
                pass
        return _unusual_tensor(value)
    return value_key(value)


class Unusual:
    """A key part for a tensor minicomp does not compile for (it runs eagerly): equal for the same
    reason, so later calls with such a tensor find their eager entry."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __eq__(self, other):
        return isinstance(other, Unusual) and other.why == self.why

    def __hash__(self):
        return hash(self.why)

    def __repr__(self):
        return f"<{self.why}>"


def _unusual_tensor(value: torch.Tensor) -> Unusual:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    if isinstance(value, (FakeTensor, FunctionalTensor)) or getattr(type(value), "stands_in_a_trace", False):
        return INSIDE_A_TRACE  # (meta_trace.Standin says so by that class attribute)
    if value.is_nested or value.layout != torch.strided:
        return Unusual(f"an argument is a {'nested' if value.is_nested else str(value.layout)} tensor")
    if value.is_neg() or value.is_conj():
        return Unusual(
            "an argument is a lazily negated or conjugated view (`.conj()`, `.conj().imag`): "
            "call .resolve_conj() / .resolve_neg() on it to compile"
        )
    return Unusual(f"an argument is a {type(value).__name__}, a tensor subclass, which eager would return")


INSIDE_A_TRACE = Unusual("called inside another trace (a jitted function calling this one)")


def unusual(leaf_keys) -> Unusual | None:
    """The first Unusual tensor of a call's leaf keys, or None."""
    return next((k for k in leaf_keys if isinstance(k, Unusual)), None)


def value_key(value, depth: int = 0):
    cls = type(value)
    if cls in _BY_VALUE:
        return (cls, value)
    if isinstance(value, float):  # by bits: -0.0 != 0.0 and nan == nan (np.float64 is a float too)
        return (cls, float(value).hex())
    if isinstance(value, complex):
        return (cls, value.real.hex(), value.imag.hex())
    if isinstance(value, enum.Enum):
        return (cls, value.name)
    if isinstance(value, np.ndarray):
        return (cls, value.dtype.str, value.shape, hashlib.sha1(np.ascontiguousarray(value).tobytes()).hexdigest())
    if isinstance(value, np.generic):
        return (cls, value.dtype.str, value.tobytes())
    if isinstance(value, slice):
        return (cls, value_key(value.start), value_key(value.stop), value_key(value.step))
    if isinstance(value, torch.Tensor):  # a tensor held by an object (not an argument): the same tensor
        return (cls, ByIdentity(value), value.shape, value.stride(), value.dtype, value.device)
    if isinstance(value, (tuple, list, frozenset)) and depth < 3:
        return (cls, tuple(value_key(v, depth + 1) for v in value))
    if isinstance(value, dict) and depth < 3:
        return (cls, tuple((value_key(k, depth + 1), value_key(v, depth + 1)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:
        return (cls, tuple(value_key(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)))
    if isinstance(value, _BY_IDENTITY) or callable(value) and hasattr(value, "__qualname__"):
        return (cls, ByIdentity(value))
    return (cls, Unguardable(value))


_BY_VALUE_LIMIT = 64  # items of a container a read value is keyed by; a larger one by identity
PLAIN = {int, float, bool, str, type(None)}  # keyed by value (a float by its bits: -0.0 is not 0.0)
SAME_OBJECT = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    type,
    torch._ops.OpOverload,
    torch._ops.OpOverloadPacket,
)


def state_key(value, depth: int = 0, memo: dict | None = None):
    """A value a trace read outside its arguments (a global, a closure cell, a module attribute),
    keyed so that what the compiled code would not follow changes the key: plain values by
    value; functions, classes and modules by identity (a rebound helper is seen); a tensor by
    identity and layout (the compiled code holds it, so in-place changes need no key); an
    nn.Module by identity and its submodules' training flags; a user object by its attributes,
    two levels down; anything else, and containers over _BY_VALUE_LIMIT items, by identity.
    `memo`: user objects keyed so far in one reading of the state (every submodule of a
    transformers model holds its one config object: keyed once, not once a submodule)."""
    cls = type(value)
    if cls in PLAIN:  # the common cases first: a call reads these every time
        return (cls, value) if cls is not float else (cls, value.hex())
    if value is reads.MISSING or isinstance(value, SAME_OBJECT):
        return value  # hashed and compared by identity
    if memo is None:
        return _state_key(value, depth, None)
    found = memo.get((id(value), depth))
    if found is None:
        found = memo[(id(value), depth)] = _state_key(value, depth, memo)
    return found


def _state_key(value, depth: int, memo: dict | None):
    """state_key of a value neither plain nor keyed as itself."""
    if isinstance(value, torch.nn.Module):
        return (type(value), ByIdentity(value), tuple(m.training for m in value.modules()))
    if user_object(value) and depth < 2:
        return (type(value), tuple((k, state_key(v, depth + 1, memo)) for k, v in vars(value).items()))
    if isinstance(value, (tuple, list, dict, set, frozenset)) and len(value) > _BY_VALUE_LIMIT:
        return (type(value), ByIdentity(value))
    key = value_key(value)
    return (type(value), ByIdentity(value)) if contains(key, Unguardable) else key


def user_object(value) -> bool:
    """An instance of a user class with attributes of its own (a config object)."""
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (type, torch.nn.Module, torch.Tensor, np.ndarray))
        and not callable(value)
        and type(value).__module__ != "builtins"
    )


_grad, _inference, _default_dtype = torch.is_grad_enabled, torch.is_inference_mode_enabled, torch.get_default_dtype
_deterministic, _any_autocast = torch._C._get_deterministic_algorithms, torch._C._is_any_autocast_enabled
_functorch_level = torch._C._functorch.maybe_current_level  # not None inside vmap, grad, jacrev, ...
_function_modes, _dispatch_modes = torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack


def global_state() -> tuple:
    """The global modes a trace depends on (grad, inference, default dtype, deterministic, autocast,
    modes), read with C calls only in the common case."""
    if _any_autocast() or _function_modes() or _dispatch_modes() or _functorch_level() is not None:
        return _global_state_in_full()
    return (_grad(), _inference(), _default_dtype(), _deterministic(), None, None)


def _global_state_in_full() -> tuple:
    autocast = None
    if _any_autocast():
        autocast = tuple(
            (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
        )
    modes = None
    if _function_modes() or _dispatch_modes() or _functorch_level() is not None:
        modes = (str(torch.get_default_device()), _function_modes(), _dispatch_modes(), _functorch_level())
    return (_grad(), _inference(), _default_dtype(), _deterministic(), autocast, modes)


def in_functorch_transform(state: tuple) -> bool:
    """Whether a `global_state` was read inside vmap, grad, jacrev, ... (its modes' functorch level)."""
    *_, modes = state
    if modes is None:
        return False
    _device, _function_modes, _dispatch_modes, functorch_level = modes
    return functorch_level is not None


def describe_state(state: tuple) -> str:
    grad, inference, dtype, deterministic, autocast, modes = state
    words = [f"grad {'on' if grad else 'off'}", f"default dtype {dtype}"]
    if inference:
        words.append("inference mode")
    if deterministic:
        words.append("deterministic algorithms")
    if autocast:
        words += [f"autocast {device} {dt}" for device, on, dt in autocast if on]
    if modes:
        device, function_modes, dispatch_modes, functorch_level = modes
        words.append(f"default device {device}, {function_modes} function / {dispatch_modes} dispatch modes")
        if functorch_level is not None:
            words.append(f"inside a functorch transform (level {functorch_level})")
    return ", ".join(words)


def describe_change(old: SignatureKey, new: SignatureKey, context) -> str:
    """What changed between two signature keys, in words (`context` describes its own state)."""
    if old.structure != new.structure:
        return "argument structure changed"
    if old.modes != new.modes:
        return f"global state {describe_state(old.modes)} -> {describe_state(new.modes)}"
    for i, (a, b) in enumerate(zip(old.leaves, new.leaves)):
        if a != b:
            if isinstance(a, Unusual) or isinstance(b, Unusual):
                return f"argument {i}: {a!r} -> {b!r}"
            if len(a) == len(TENSOR_FIELDS) and len(b) == len(TENSOR_FIELDS):
                changed = [f"{f} {x} -> {y}" for f, x, y in zip(TENSOR_FIELDS, a, b) if x != y]
                return f"argument {i}: " + ", ".join(changed)
            return f"argument {i}: {a[-1]!r} -> {b[-1]!r}"
    if old.context != new.context:
        return context.describe(old.context, new.context)
    return "same signature"


def contains(key, cls) -> bool:
    """Does a key (nested tuples) hold a part of class `cls` (ByIdentity, Unguardable)?"""
    if isinstance(key, cls):
        return True
    if isinstance(key, tuple):
        return any(contains(part, cls) for part in key)
    return False


def unguardable(key):
    """The first Unguardable part of a key, or None."""
    if isinstance(key, Unguardable):
        return key
    if isinstance(key, tuple):
        for part in key:
            found = unguardable(part)
            if found is not None:
                return found
    return None
