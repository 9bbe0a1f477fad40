"""A hash of everything a function's compiled code depends on: the persistent cache's key.

A second process must find the module compiled for (function, signature)
without tracing the function again (tracing alone costs more than the 50 ms a
warm start may take). Across processes a function is identified by:

  * its code object: bytecode, constants, names, recursively through nested code;
  * its default arguments and closure cells;
  * every global it names: a plain constant (number, string, dtype, tuples of
    them) by value, a module by name, a user function by its own fingerprint
    (recursively), a library function (torch, math, ...) by its qualified name;
  * the versions of Python, torch and triton, and a hash of minicomp's own
    source and templates (library code is covered by them).

Anything else a function reads (a tensor, an object, a class of the user's)
makes it unfingerprintable: `of` returns None and that function is traced in
every process. Correct, just not a 50 ms start.
"""
from __future__ import annotations

import hashlib
import sys
import types

import torch

LIBRARIES = ("torch", "triton", "numpy", "math", "operator", "functools", "builtins", "minicomp", "einops")
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


class Unfingerprintable(Exception):
    pass


def of(fn) -> str | None:
    """The fingerprint of `fn`, or None when it reads something that has none."""
    import triton

    from minicomp.runtime import compiler_hash

    parts: list[str] = [sys.version, torch.__version__, triton.__version__, compiler_hash()]
    try:
        _function(fn, parts, set())
    except Unfingerprintable:
        return None
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def _function(fn, parts: list[str], seen: set[int]) -> None:
    if id(fn) in seen:
        parts.append(f"<recursion {fn.__qualname__}>")
        return
    seen.add(id(fn))
    code = fn.__code__
    parts.append(f"def {fn.__module__}.{fn.__qualname__}")
    _code(code, parts)
    for default in (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).items()):
        _value(default, parts, seen)
    for cell in fn.__closure__ or ():
        _value(cell.cell_contents, parts, seen)
    for name in sorted(_global_names(code)):
        if name in fn.__globals__:
            parts.append(f"global {name}")
            _value(fn.__globals__[name], parts, seen)


def _code(code: types.CodeType, parts: list[str]) -> None:
    parts += [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, parts)
        else:
            parts.append(repr(const))


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _value(value, parts: list[str], seen: set[int]) -> None:
    if isinstance(value, _PLAIN):
        parts.append(f"{type(value).__name__}:{value!r}")
    elif isinstance(value, (tuple, list, frozenset)):
        parts.append(f"{type(value).__name__}[{len(value)}]")
        for item in value:
            _value(item, parts, seen)
    elif isinstance(value, types.ModuleType):
        parts.append(f"module {value.__name__}")
    elif _is_library(value):
        parts.append(f"library {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}")
    elif isinstance(value, types.FunctionType):
        _function(value, parts, seen)
    else:
        raise Unfingerprintable(type(value).__name__)


def _is_library(value) -> bool:
    """A library function, builtin, class or ATen op: named, never instances with state."""
    kinds = (types.FunctionType, types.BuiltinFunctionType, type, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
    module = getattr(value, "__module__", None) or ""
    return isinstance(value, kinds) and module.split(".")[0] in LIBRARIES
