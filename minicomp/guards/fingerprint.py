"""A hash of everything a function's compiled code depends on: the persistent cache's key.

A second process must find the module compiled for (function, signature)
without tracing the function again. Across processes a function is identified by:

  * its code object: bytecode, constants, names, recursively through nested code;
  * its default arguments and closure cells;
  * every global it names: a plain constant (number, string, dtype, tuples of
    them) by value, a user function by its own fingerprint (recursively), a
    library function (torch, math, ...) by its qualified name; a module by name
    *and* every attribute of it the code could read (each name the code uses
    that the module has: `cfg.SCALE`, `helpers.act`), by the same rules;
  * a bound method's object, a `functools.partial`'s function and arguments,
    and for `jit(module)` every class of the module tree with all its methods
    (`of_module`; the module's attribute values are in the signature key);
  * the versions of Python, torch and triton, and a hash of minicomp's own
    source and templates (library code is covered by them).

Anything else a function reads (a tensor, an object, a class of the user's)
makes it unfingerprintable: `of` returns None and that function is traced in
every process.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from pathlib import Path

import torch

from minicomp import config
from minicomp.guards import reads

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


class Unfingerprintable(Exception):
    pass


def of(fn) -> str | None:
    """The fingerprint of `fn`, or None when it reads something that has none."""
    return _digest(lambda parts: _value(fn, parts, set()))


def of_module(module: torch.nn.Module) -> str | None:
    """The fingerprint of an nn.Module's code: the class of every submodule, with its methods."""

    def walk(parts):
        seen: set[int] = set()
        for name, m in module.named_modules():
            parts.append(f"submodule {name}")
            _class(type(m), parts, seen)

    return _digest(walk)


@functools.cache
def compiler_hash() -> str:
    """A hash of minicomp's own source and templates: a changed compiler never reuses old entries."""
    package = Path(__file__).resolve().parents[1]
    templates = config.templates_directory()
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + path.read_bytes())
    for path in sorted(templates.glob("*.j2")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:20]


def _digest(walk) -> str | None:
    import triton

    parts: list[str] = [sys.version, torch.__version__, triton.__version__, compiler_hash()]
    try:
        walk(parts)
    except (Unfingerprintable, RecursionError):
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
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell (a name not bound yet)
            parts.append("<empty cell>")
            continue
        _value(contents, parts, seen)
    names = reads.code_names(code)
    for name in sorted(names):
        if name in fn.__globals__:
            parts.append(f"global {name}")
            _value(fn.__globals__[name], parts, seen, names)


def _class(cls: type, parts: list[str], seen: set[int]) -> None:
    """A class by its methods and class attributes, through its bases up to library classes."""
    for klass in cls.__mro__:
        if id(klass) in seen:
            parts.append(f"class {klass.__qualname__} (again)")
            continue
        seen.add(id(klass))
        if reads.is_library(klass) or klass is object:
            parts.append(f"library class {klass.__module__}.{klass.__qualname__}")
            continue
        parts.append(f"class {klass.__module__}.{klass.__qualname__}")
        for name, member in sorted(vars(klass).items()):
            if name in ("__dict__", "__weakref__", "__module__", "__doc__", "__annotations__"):
                continue
            parts.append(f"member {name}")
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property):
                for accessor in (member.fget, member.fset, member.fdel):
                    if accessor is not None:
                        _value(accessor, parts, seen)
                continue
            _value(member, parts, seen)


def _code(code: types.CodeType, parts: list[str]) -> None:
    parts += [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, parts)
        else:
            parts.append(repr(const))


def _value(value, parts: list[str], seen: set[int], names: set[str] = frozenset()) -> None:
    """`names`: what the code that reads `value` names (a module's attributes it may read)."""
    if isinstance(value, float):
        parts.append(f"float:{float(value).hex()}")  # -0.0 and 0.0 differ
    elif isinstance(value, _PLAIN):
        parts.append(f"{type(value).__name__}:{value!r}")
    elif isinstance(value, (tuple, list, frozenset)):
        parts.append(f"{type(value).__name__}[{len(value)}]")
        for item in value:
            _value(item, parts, seen)
    elif isinstance(value, types.ModuleType):
        _module(value, parts, seen, names)
    elif isinstance(value, types.MethodType):
        parts.append("bound method")
        _value(value.__self__, parts, seen)
        _value(value.__func__, parts, seen)
    elif isinstance(value, functools.partial):
        parts.append("partial")
        for item in (value.func, value.args, tuple(sorted(value.keywords.items()))):
            _value(item, parts, seen)
    elif reads.is_library(value):
        parts.append(f"library {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}")
    elif isinstance(value, types.FunctionType):
        _function(value, parts, seen)
    elif isinstance(value, type):
        _class(value, parts, seen)
    elif isinstance(value, torch.nn.Module):
        parts.append("module object")
        _class(type(value), parts, seen)
        raise Unfingerprintable("an nn.Module's state lives in the signature key only for jit(module)")
    else:
        raise Unfingerprintable(type(value).__name__)


def _module(module: types.ModuleType, parts: list[str], seen: set[int], names) -> None:
    """A module by name, and each attribute the code may read through it (any name it uses that
    the module has). A library's attributes that have no fingerprint are named by type: they
    belong to an installed version that is part of the hash."""
    parts.append(f"module {module.__name__}")
    key = ("module", id(module))
    if key in seen:
        return
    seen.add(key)
    library = module.__name__.split(".")[0] in reads.LIBRARIES
    for name in sorted(names):
        if not hasattr(module, name):
            continue
        attribute = getattr(module, name)
        parts.append(f"attribute {name}")
        if library and not isinstance(attribute, (types.FunctionType, types.ModuleType)):
            try:
                _value(attribute, parts, seen, names)
            except Unfingerprintable:
                parts.append(f"library object {type(attribute).__qualname__}")
        else:
            _value(attribute, parts, seen, names)
