"""A function's Python context: what its trace reads, keyed on every call, and what a trace may
change, watched and undone.

`FunctionContext` is a plain function's: the values it reads besides its arguments (reads.py
lists where they live; guards.state_key keys each), checked per call, and the globals and bound
object's attributes it may change. dispatch/modules.py's `ModuleContext` is a module's. `watch` runs a trace
under a context: a trace that changed what the context watches (a global rebound, `self.k += 1`,
`LOG.append(y)`: `Held`) is undone and refused with `guards.SideEffect`, and the call runs
eagerly, so the change happens once per call, as in eager.
"""

from __future__ import annotations

import operator
import types

from minicomp import guards
from minicomp.guards import SideEffect, reads, state_key


def _fixed(value) -> bool:
    """A value whose key cannot change while it is the same object."""
    return type(value) in guards.PLAIN or value is reads.MISSING or isinstance(value, guards.SAME_OBJECT)


def changed_read(read: reads.Reads, old: tuple, new: tuple) -> str:
    """Which value read (`read`) differs between two keys of `state_key`s, in words."""
    for name, a, b in zip(read.names(), old, new):
        if a != b:
            return f"{name} changed"
    return "the values it reads changed"


def watch(fn, context):
    """`fn`, checked: if a call changes what `context` watches, the change is undone and
    SideEffect raised (a compiled entry would not repeat it on later calls). A call that raises
    part way is undone too: what runs next (eager, or make_fx after meta_trace) makes it once."""

    def watched(*args, **kwargs):
        before = context.snapshot()
        try:
            result = fn(*args, **kwargs)
        except BaseException:  # a trace that failed part way: undone too (eager, or make_fx, runs it next)
            if context.changed(before):
                context.restore(before)
            raise
        changed = context.changed(before)
        if changed:
            context.restore(before)
            raise SideEffect(f"it changes {changed} each time it runs, which compiled code would not repeat")
        return result

    return watched


class FunctionContext:
    """What a plain function's trace reads (`reads.Reads`: globals, closure cells, those of the
    user functions it calls), checked on every call; and what it may change: the plain
    globals it names, and the attributes of the object its method is bound to."""

    def __init__(self, fn):
        self.fn = fn
        code = getattr(fn, "__code__", None)
        self.globals = getattr(fn, "__globals__", {}) if code is not None else {}
        self.names = sorted(reads.code_names(code)) if code is not None else []
        self.owner = getattr(fn, "__self__", None) if isinstance(fn, types.MethodType) else None
        self.reads = reads.Reads(fn)
        self._last: tuple[list, tuple | None] = ([], None)  # values whose key is their identity, and that key

    def state(self) -> tuple:
        """The values the trace read, keyed (`state_key`): a changed one is a new signature. When
        every value is one whose key is its identity or value (a number, a string, a module, a
        function, a class) and each is the same object as last call, the last key is reused."""
        values = self.reads.values()
        last_values, last_key = self._last
        if last_key is not None and len(values) == len(last_values) and all(map(operator.is_, values, last_values)):
            return last_key
        key = tuple(map(state_key, values))
        self._last = (values, key) if all(map(_fixed, values)) else ([], None)
        return key

    def describe(self, old: tuple, new: tuple) -> str:
        return changed_read(self.reads, old, new)

    def split(self, state: tuple) -> tuple[None, tuple]:
        """(what of `state` a key on disk holds, what the fingerprint covers): all read values."""
        return None, state

    def snapshot(self):
        values = {name: self.globals[name] for name in self.names if name in self.globals}
        attrs = dict(vars(self.owner)) if self.owner is not None and hasattr(self.owner, "__dict__") else None
        held = Held(zip(self.reads.names(), self.reads.values()))
        return values, attrs, held

    def changed(self, before) -> str | None:
        values, attrs, held = before
        for name in self.names:
            if name in self.globals and (name not in values or values[name] is not self.globals[name]):
                return f"the global {name!r}"
        if attrs is not None:
            now = vars(self.owner)
            for name in set(attrs) | set(now):
                if attrs.get(name, attrs) is not now.get(name, attrs):
                    return f"the attribute {name!r} of its {type(self.owner).__name__}"
        return held.changed()

    def restore(self, before) -> None:
        values, attrs, held = before
        for name in self.names:
            if name in values:
                self.globals[name] = values[name]
            else:
                self.globals.pop(name, None)
        if attrs is not None:
            vars(self.owner).clear()
            vars(self.owner).update(attrs)
        held.restore()


class Held:
    """What mutable values hold (a list's items, a dict's or an object's entries), copied one
    level deep before a trace: a trace that appends to a global list or bumps a counter in a
    config object changed them, and compiled code would not repeat that. `changed` names the
    first such value; `restore` puts the items back (eager then applies the change once)."""

    def __init__(self, named_values):
        self.held = [(name, value, _contents(value)) for name, value in named_values]
        self.held = [entry for entry in self.held if entry[2] is not None]

    def changed(self) -> str | None:
        for name, value, contents in self.held:
            if not _same_contents(value, contents):
                return f"what {name} holds"
        return None

    def restore(self) -> None:
        for _, value, contents in self.held:
            if isinstance(value, list):
                value[:] = contents
            else:
                entries = value if isinstance(value, (dict, set)) else vars(value)
                entries.clear()
                entries.update(contents)


def _contents(value):
    """A shallow copy of what a plain list, dict, set or user object holds (None for anything else,
    a subclass of list, dict or set included: it may keep its items its own way)."""
    if type(value) in (list, dict, set):
        return type(value)(value)
    return dict(vars(value)) if guards.user_object(value) and not isinstance(value, (list, dict, set)) else None


def _same_contents(value, contents) -> bool:
    if isinstance(value, list):
        return len(value) == len(contents) and all(a is b for a, b in zip(value, contents))
    if isinstance(value, set):
        return len(value) == len(contents) and all(item in contents for item in value)
    entries = value if isinstance(value, dict) else vars(value)
    return entries.keys() == contents.keys() and all(entries[k] is contents[k] for k in contents)
