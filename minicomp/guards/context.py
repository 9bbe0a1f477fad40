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
import sys
import threading
import types

from minicomp import guards
from minicomp.guards import SideEffect, reads, state_key


def _fixed(value) -> bool:
    """A value whose key cannot change while it is the same object."""
    if type(value) is tuple:  # a function's defaults
        return all(type(item) in guards.PLAIN for item in value)
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
        # a bound method's class: what `self.helper(x)` looks up (the caller binds fn's own defaults)
        classes = (type(self.owner),) if self.owner is not None else ()
        self.reads = reads.Reads(fn, classes=classes, bound=fn)
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
        held.stop()
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
        _put_back(self.globals, values, self.names)
        if attrs is not None:
            _put_back(vars(self.owner), attrs)
        held.restore()


def _put_back(entries: dict, before: dict, names=None) -> None:
    """Each of `names` (all of both dicts') whose entry is not the object it was `before` put back
    (one `before` lacks: removed); the others are left as they are (another thread's)."""
    for name in set(before) | set(entries) if names is None else names:
        old = before.get(name, _put_back)
        if entries.get(name, _put_back) is not old:
            if old is _put_back:
                entries.pop(name, None)
            else:
                entries[name] = old


class Held:
    """What mutable values hold (a list's items, a dict's or an object's entries), copied one
    level deep before a trace: a trace that appends to a global list or bumps a counter in a
    config object changed them, and compiled code would not repeat that. `changed` names the
    first such value; `restore` puts the items back (eager then applies the change once)."""

    def __init__(self, named_values):
        self.held = [(name, value, _contents(value)) for name, value in named_values]
        self.held = [entry for entry in self.held if entry[2] is not None]
        self.writes = _Writes.start(self.held)

    def stop(self) -> None:
        if self.writes is not None:
            self.writes.stop()

    def changed(self) -> str | None:
        self.stop()
        for name, value, contents in self.held:
            if not _same_contents(value, contents) and (self.writes is None or self.writes.by_trace(value, contents)):
                return f"what {name} holds"
        return None

    def restore(self) -> None:
        self.stop()
        for _, value, contents in self.held:
            if self.writes is not None and isinstance(value, list) and _appended_to(value, contents):
                self.writes.undo_appends(value)  # another thread's appends stay
            elif self.writes is not None and not self.writes.by_trace(value, contents):
                continue  # another thread's change
            elif isinstance(value, list):
                value[:] = contents
            else:
                entries = value if isinstance(value, (dict, set)) else vars(value)
                entries.clear()
                entries.update(contents)


class _Writes:
    """The calls the tracing thread makes to a held list's, dict's or set's own methods
    (`LOG.append(y)`, `CACHE.update(...)`), recorded with sys.setprofile (this thread alone) while
    other threads run: what changed and was not the trace's, another thread's append to a list
    the function reads, is neither a side effect of the trace nor put back. A list's trace
    appends are undone one by one; what other threads appended stays."""

    def __init__(self, held):
        self.ids = {id(value) for _, value, _ in held if isinstance(value, (list, dict, set))}
        self.touched: set[int] = set()  # containers the trace called a method of, other than append/extend
        self.appended: dict[int, list] = {}  # a list's id -> the items the trace appended
        self._pending: list = []
        self._thread = threading.get_ident()

    @classmethod
    def start(cls, held):
        """Recording, where another thread may change what the trace holds; None where there is
        none (or a profiler is set: what it records stays its own, as before)."""
        if threading.active_count() < 2 or sys.getprofile() is not None:
            return None
        writes = cls(held)
        if not writes.ids:
            return None
        sys.setprofile(writes._event)
        return writes

    def stop(self) -> None:
        if threading.get_ident() == self._thread and sys.getprofile() == self._event:
            sys.setprofile(None)

    def _event(self, frame, event, arg) -> None:
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            if id(owner) in self.ids:
                name = arg.__name__
                if name in ("append", "extend") and isinstance(owner, list):
                    self._pending.append((owner, len(owner)))
                elif name not in _READING_METHODS:
                    self.touched.add(id(owner))
        elif event == "c_return" and self._pending:
            owner = getattr(arg, "__self__", None)
            if self._pending[-1][0] is owner:
                owner, start = self._pending.pop()
                items = owner[-1:] if arg.__name__ == "append" else owner[start:]
                self.appended.setdefault(id(owner), []).extend(items)

    def by_trace(self, value, contents) -> bool:
        """Whether the trace may have made the change to `value` (dicts, sets, objects: written by
        `d[k] = v` or `obj.n += 1`, which no call shows, so any change counts)."""
        if isinstance(value, list) and _appended_to(value, contents):
            return id(value) in self.appended or id(value) in self.touched
        return not isinstance(value, (list, set)) or id(value) in self.touched or id(value) in self.appended

    def undo_appends(self, value: list) -> None:
        for item in reversed(self.appended.get(id(value), [])):
            for i in range(len(value) - 1, -1, -1):
                if value[i] is item:
                    del value[i]
                    break


_READING_METHODS = frozenset({"copy", "count", "index", "get", "keys", "values", "items", "__contains__", "__len__"})


def _appended_to(value: list, contents: list) -> bool:
    """`value` is `contents` with items after them (only appends since)."""
    return len(value) >= len(contents) and all(a is b for a, b in zip(value, contents))


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
