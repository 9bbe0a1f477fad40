"""`@minicomp.jit`: one compiled module per input signature, looked up on every call.

A call flattens its arguments, builds the signature key (each tensor's shape,
stride, dtype, device, requires_grad; each Python scalar's type and value),
and finds the compiled entry for it; the first call with a new key traces and
compiles. A hit does nothing else: the generated `call` launches the kernels.
"""
from __future__ import annotations

import functools
import inspect
import os
import threading
import warnings

import torch
from torch.utils import _pytree as pytree

from minicomp import capture
from minicomp.autograd import TrainingEntry
from minicomp.compiler import Compiled, compile_graph


class CompileError(RuntimeError):
    """minicomp could not compile a function (raised when fallback="raise")."""


def _leaf_key(value):
    if isinstance(value, torch.Tensor):
        return (value.shape, value.stride(), value.dtype, value.device, value.requires_grad)
    try:
        hash(value)
    except TypeError:
        return (type(value), repr(value))
    return (type(value), value)


def _needs_grad(leaves) -> bool:
    """Grad mode is on and some tensor argument requires grad."""
    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves)


class Entry:
    """What one signature compiled to: a fused graph, or eager after a failure."""

    def __init__(self, traced: capture.Traced | None, compiled: Compiled | None):
        self.traced, self.compiled = traced, compiled

    @property
    def source(self) -> str:
        return self.compiled.source

    def __call__(self, fn, leaves, in_spec):
        if self.compiled is None:  # fell back to eager
            args, kwargs = pytree.tree_unflatten(leaves, in_spec)
            return fn(*args, **kwargs)
        outputs = self.compiled.call(*[leaves[i] for i in self.traced.tensor_slots])
        return pytree.tree_unflatten(list(outputs), self.traced.out_spec)


class JitFunction:
    """A function compiled by minicomp; call it like the original."""

    def __init__(self, fn, fallback: str | None = None):
        self.fn = fn
        self.fallback = fallback or os.environ.get("MINICOMP_FALLBACK", "warn")
        if self.fallback not in ("warn", "raise", "silent"):
            raise ValueError(f"fallback must be 'warn', 'raise' or 'silent', not {self.fallback!r}")
        self.signature = inspect.signature(fn)
        self.params = list(self.signature.parameters)
        self._plain = all(p.kind == p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values())
        self.cache: dict[tuple, Entry] = {}
        self.compiles = 0  # how many signatures were compiled (tests and `recompiles` logs read it)
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    # -- the call path --------------------------------------------------------
    def _flatten(self, args, kwargs):
        """(leaves, in_spec): the arguments as a flat list, defaults bound."""
        if self._plain and not kwargs and len(args) == len(self.params) \
                and not any(isinstance(a, (list, tuple, dict)) for a in args):
            return list(args), self._flat_spec(len(args))
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return pytree.tree_flatten((bound.args, bound.kwargs))

    @functools.lru_cache(maxsize=8)
    def _flat_spec(self, n):
        return pytree.tree_flatten((tuple(range(n)), {}))[1]

    def _key(self, leaves, in_spec):
        return (in_spec, tuple(map(_leaf_key, leaves)), torch.is_grad_enabled())

    def __call__(self, *args, **kwargs):
        leaves, in_spec = self._flatten(args, kwargs)
        key = self._key(leaves, in_spec)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._compile(key, leaves, in_spec)
        return entry(self.fn, leaves, in_spec)

    def _compile(self, key, leaves, in_spec) -> Entry:
        with self._lock:
            if key in self.cache:
                return self.cache[key]
            names = capture.leaf_names(in_spec, self.params)
            try:
                if _needs_grad(leaves):
                    entry = TrainingEntry(self.fn, leaves, in_spec, self.__name__,
                                          [n for n, v in zip(names, leaves) if isinstance(v, torch.Tensor)])
                else:
                    traced = capture.trace(self.fn, leaves, in_spec, names)
                    entry = Entry(traced, compile_graph(traced.gm, self.__name__, traced.input_names))
            except Exception as err:  # noqa: BLE001 - any failure falls back to eager, by policy
                if self.fallback == "raise":
                    raise CompileError(f"minicomp could not compile {self.__name__}: {err}") from err
                if self.fallback == "warn":
                    warnings.warn(f"minicomp could not compile {self.__name__} ({type(err).__name__}: {err}); "
                                  "running it eagerly", stacklevel=3)
                entry = Entry(None, None)
            self.cache[key] = entry
            self.compiles += 1
            return entry

    # -- looking inside -------------------------------------------------------
    def entry(self, *args, **kwargs) -> "Entry | TrainingEntry":
        """What these arguments compile to (compiling it if needed)."""
        leaves, in_spec = self._flatten(args, kwargs)
        key = self._key(leaves, in_spec)
        return self.cache.get(key) or self._compile(key, leaves, in_spec)

    def compiled(self, *args, **kwargs) -> Compiled:
        """The compiled graph for these arguments (the forward graph when training)."""
        entry = self.entry(*args, **kwargs)
        compiled = entry.forward if isinstance(entry, TrainingEntry) else entry.compiled
        if compiled is None:
            raise CompileError(f"{self.__name__} runs eagerly for these arguments: nothing was compiled")
        return compiled

    def source(self, *args, **kwargs) -> str:
        """The generated module(s) for these arguments: Triton kernels + Python wrapper
        (forward, then backward, when an input requires grad)."""
        entry = self.entry(*args, **kwargs)
        return entry.source if isinstance(entry, TrainingEntry) else self.compiled(*args, **kwargs).source


def jit(fn=None, *, fallback: str | None = None):
    """Compile `fn` with minicomp: `@jit`, `@jit(fallback="raise")` or `jit(fn)`.

    fallback: what happens when a signature cannot be compiled: "warn" (run
    eagerly with a warning, the default; env MINICOMP_FALLBACK), "silent", or
    "raise" (CompileError).
    """
    if fn is None:
        return lambda f: JitFunction(f, fallback)
    return JitFunction(fn, fallback)
