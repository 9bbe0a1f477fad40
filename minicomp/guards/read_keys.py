"""The keys of what a function or module reads (guards.state_key of each value), one call after
another: a value that is the same object as last call and whose key cannot change while it is
keeps its key; the others are keyed again, each object once a call. Used by context.py's
`FunctionContext` and dispatch/modules.py's `ModuleContext`."""

from __future__ import annotations

import operator

from minicomp import guards
from minicomp.guards import reads, state_key
from minicomp.guards.key import IMMUTABLE

_CONTAINERS = (dict, list, set, frozenset, tuple)


def _fixed(value, key) -> bool:
    """Whether `value`'s key (`key`, its state_key) cannot change while it is the same object: an
    immutable value (a number, a string, a dtype), a tuple of plain ones (a function's defaults),
    one keyed by its identity alone (a function, a class, a module, a compiled pattern, a bound
    method). Not a container, whose items may change (one keyed by identity for its size may
    shrink), nor a user object (keyed by its attributes), a tensor or a module (by their layout
    and training flags)."""
    if type(value) is tuple:
        return all(type(item) in guards.PLAIN for item in value)
    if type(value) in IMMUTABLE or value is reads.MISSING or isinstance(value, guards.SAME_OBJECT):
        return True
    return (
        not isinstance(value, _CONTAINERS)
        and type(key) is tuple
        and len(key) == 2
        and key[0] is type(value)
        and type(key[1]) in (guards.ByIdentity, guards.Unguardable)
        and key[1].obj is value
    )


class ReadKeys:
    """The keys (state_key) of the values a context reads, one reading after another: a value that
    is the same object as at the last reading, with a key that cannot change while it is
    (`_fixed`), keeps its key; the others are keyed again, each object once a reading (`memo`).
    A transformers GPT-2's module reads 2848 values (the globals of its classes' methods and of
    what they call), 166 of them not fixed, 764 distinct objects: keyed anew on each call, they
    took 2.8 ms of it."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last: tuple[list, tuple, list[int]] = ([], (), [])  # values, their keys, positions keyed each time

    def __call__(self, values: list, memo: dict | None = None) -> tuple:
        memo = {} if memo is None else memo
        last_values, last_keys, again = self._last  # (one read: another thread may replace it meanwhile)
        if len(values) == len(last_values) and all(map(operator.is_, values, last_values)):
            if not again:
                return last_keys
            keys = list(last_keys)
            for i in again:
                keys[i] = state_key(values[i], 0, memo)
            return tuple(keys)
        keys = tuple(state_key(v, 0, memo) for v in values)
        self._last = (values, keys, [i for i, (v, k) in enumerate(zip(values, keys)) if not _fixed(v, k)])
        return keys
