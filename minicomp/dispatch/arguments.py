"""A call's arguments as leaves and a spec: what a compiled function's cache key holds of them,
and what tracing and eager calls unflatten.

`Arguments.flatten` takes three paths, fastest first:
- every parameter passed positionally and none a container: the arguments themselves, and the
  argument count as the spec (an int hashes far faster than a TreeSpec);
- a module's call `(state, *args)` (modules.py), its other arguments pytree leaves: the state's
  values then the arguments, and the TreeSpec pytree gives such a call, kept per state names and
  argument count;
- else the signature binds them, defaults included, and pytree flattens the result.
"""

from __future__ import annotations

import inspect

import torch
from torch.utils import _pytree as pytree

_LEAVES = (torch.Tensor, int, float, str)  # arguments pytree keeps whole (bool is an int; None is a node)


class Arguments:
    """How calls of `fn` flatten (`state_first`: `fn` is a module's `(state, *args, **kwargs)`;
    `limit`: how many state specs are kept)."""

    def __init__(self, fn, state_first: bool = False, limit: int = 64):
        self.fn = fn
        self.signature = _signature(fn)
        self.params = list(self.signature.parameters) if self.signature is not None else []
        self._defaults = _defaults_of(fn)  # what `signature` binds missing arguments to
        self._plain = self.signature is None or all(
            p.kind == p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values()
        )
        self._state_first = state_first
        self._state_specs: dict[tuple, object] = {}  # (state names, argument count) -> in_spec
        self._limit = limit

    def flatten(self, args, kwargs):
        """(leaves, in_spec): the arguments as a flat list, defaults bound."""
        if self._plain and not kwargs and (self.signature is None or len(args) == len(self.params)):
            for a in args:
                if isinstance(a, (list, tuple, dict)):
                    break
            else:
                return args, len(args)
        if self._state_first and not kwargs and args and type(args[0]) is dict:
            flat = self._state_call(args)
            if flat is not None:
                return flat
        if self.signature is None:
            return pytree.tree_flatten((args, kwargs))
        defaults = _defaults_of(self.fn)
        if not _same_defaults(defaults, self._defaults):  # `fn.__defaults__ = ...` since: bind the new ones
            self.signature, self._defaults = _signature(self.fn), defaults
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return pytree.tree_flatten((bound.args, bound.kwargs))

    def _state_call(self, args):
        """(leaves, in_spec) of a module's call `(state, *args)` whose other arguments are pytree
        leaves (tensors, numbers, strings), else None."""
        rest = args[1:]
        for a in rest:
            if not isinstance(a, _LEAVES):
                return None
        shape = (tuple(args[0]), len(rest))
        spec = self._state_specs.get(shape)
        if spec is None:
            if len(self._state_specs) >= self._limit:  # (a module whose names change on every call)
                self._state_specs.clear()
            spec = self._state_specs[shape] = pytree.tree_flatten(((dict.fromkeys(shape[0], 0), *rest), {}))[1]
        return [*args[0].values(), *rest], spec

    @staticmethod
    def spec(in_spec):
        """The TreeSpec of a flattened call (the fast path keeps only the argument count)."""
        if isinstance(in_spec, int):
            return pytree.tree_flatten((tuple(range(in_spec)), {}))[1]
        return in_spec


def _signature(fn) -> inspect.Signature | None:
    """The signature to bind arguments with, or None (builtins like torch.relu: passed as given)."""
    try:
        return inspect.signature(fn)
    except (ValueError, TypeError):
        return None


def _defaults_of(fn) -> tuple:
    """A function's defaults, positional and keyword-only (a dict, which may change in place: copied)."""
    kwdefaults = getattr(fn, "__kwdefaults__", None)
    return getattr(fn, "__defaults__", None), None if kwdefaults is None else tuple(kwdefaults.items())


def _same_defaults(a: tuple, b: tuple) -> bool:
    (positional, keyword), (old_positional, old_keyword) = a, b
    if positional is not old_positional or (keyword is None) != (old_keyword is None):
        return False
    return keyword is None or (
        len(keyword) == len(old_keyword) and all(k == j and v is w for (k, v), (j, w) in zip(keyword, old_keyword))
    )
