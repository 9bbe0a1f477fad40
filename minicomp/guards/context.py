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

import dis
import os
import sys
import threading
import types

import torch

from minicomp import guards
from minicomp.guards import SideEffect, reads
from minicomp.guards.read_keys import ReadKeys


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
        self._keys = ReadKeys()

    def state(self) -> tuple:
        """The values the trace read, keyed (`state_key`): a changed one is a new signature. A
        value that is the same object as last call, with a key that cannot change while it is (a
        number, a string, a module, a function, a class), keeps its key (ReadKeys)."""
        return self._keys(self.reads.values())

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
    first such value; `restore` puts back what the trace changed (eager then applies the change
    once). Where other threads run, only the trace's own writes count (`_Writes`): another
    thread's appends, `+=`, `d[k] = v` or attribute writes meanwhile are neither a side effect
    of the trace nor undone."""

    def __init__(self, named_values):
        # sys.modules is the import system's: a lazy import inside torch while tracing adds to it
        self.held = [(name, value, _contents(value)) for name, value in named_values if value is not sys.modules]
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
            if self.writes is not None:
                self.writes.undo(value, contents)
            elif isinstance(value, list):
                value[:] = contents
            else:
                entries = value if isinstance(value, (dict, set)) else vars(value)
                entries.clear()
                entries.update(contents)


class _Writes:
    """The tracing thread's own writes to held values, while other threads run (recorded for this
    thread alone): the calls it makes to a held list's, dict's or set's own methods and to
    `setattr`/`delattr` (sys.setprofile), and the bytecodes of the user's frames that write in
    place (`d[k] = v`, `del d[k]`, `obj.n = v`, `L += [...]`, `S |= {...}`: sys.settrace's
    opcode events). Each is bracketed by copies of the held values, so a write is known by what
    it changed: the items a list gained at its end, the keys of a dict or an object, the items
    of a set. Another thread's changes meanwhile are in none of these, and stay. Where a tracer
    is set already (a debugger, coverage), bytecodes are not followed: a dict's or an object's
    change then counts as the trace's, as a single thread's would."""

    def __init__(self, held):
        self.values = {id(value): value for _, value, _ in held}
        self.touched: set[int] = set()  # lists the trace changed other than at their end
        self.appended: dict[int, list] = {}  # a list's id -> the items the trace appended
        self.keys: dict[int, set] = {}  # a dict's, set's or object's id -> the keys (items) the trace wrote
        self.opcodes = False  # bytecodes followed (else dicts' and objects' changes all count)
        self._calls: list = []  # (callable, copies) of the calls under way that may write
        self._op: tuple | None = None  # (frame, copies) of a writing bytecode under way
        self._thread = threading.get_ident()

    @classmethod
    def start(cls, held):
        """Recording, where another thread may change what the trace holds; None where there is
        none (or a profiler is set: what it records stays its own, as before)."""
        if threading.active_count() < 2 or sys.getprofile() is not None:
            return None
        writes = cls(held)
        if not writes.values:
            return None
        sys.setprofile(writes._event)
        if sys.gettrace() is None:
            writes.opcodes = True
            sys.settrace(writes._call)
        return writes

    def stop(self) -> None:
        if threading.get_ident() != self._thread:
            return
        if sys.getprofile() == self._event:
            sys.setprofile(None)
        if sys.gettrace() == self._call:
            sys.settrace(None)
        if self._op is not None:
            self._record(self._op[1])
            self._op = None
        while self._calls:
            self._record(self._calls.pop()[1])

    # -- recording ----------------------------------------------------------------------
    def _event(self, frame, event, arg) -> None:
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            if (id(owner) in self.values and arg.__name__ not in _READING_METHODS) or arg in _SETTERS:
                self._calls.append((arg, self._copies()))
        elif event in ("c_return", "c_exception") and self._calls and self._calls[-1][0] is arg:
            self._record(self._calls.pop()[1])

    def _call(self, frame, event, arg):
        """sys.settrace's: the user's frames are followed bytecode by bytecode (torch's and
        minicomp's are not: they write no user state, and they are most of a trace)."""
        if frame.f_code.co_filename.startswith(_PACKAGES):
            return None
        frame.f_trace_opcodes = True
        return self._step

    def _step(self, frame, event, arg):
        if self._op is not None and self._op[0] is frame:
            self._record(self._op[1])
            self._op = None
        if event == "opcode":
            code = frame.f_code.co_code
            op = code[frame.f_lasti]
            if op in _WRITE_OPS or (op == _BINARY_OP and code[frame.f_lasti + 1] in _INPLACE_ARGS):
                self._op = (frame, self._copies())
        return self._step

    def _copies(self) -> dict:
        return {key: _contents(value) for key, value in self.values.items()}

    def _record(self, before: dict) -> None:
        """What changed since `before` (the copies taken before a write): the trace's. (Never
        raises: an error here would surface in the user's frame.)"""
        try:
            self._changes(before)
        except Exception:  # noqa: BLE001 - then every change counts as the trace's, as before
            self.opcodes = False
            self.touched.update(key for key, value in self.values.items() if isinstance(value, list))

    def _changes(self, before: dict) -> None:
        for key, value in self.values.items():
            old = before[key]
            if _same_contents(value, old):
                continue
            if isinstance(value, list):
                if _appended_to(value, old) and key not in self.touched:
                    self.appended.setdefault(key, []).extend(value[len(old) :])
                else:
                    self.touched.add(key)
            elif isinstance(value, set):
                self.keys.setdefault(key, set()).update(value ^ old)
            else:
                entries = value if isinstance(value, dict) else vars(value)
                written = {k for k in set(entries) | set(old) if entries.get(k, _Writes) is not old.get(k, _Writes)}
                self.keys.setdefault(key, set()).update(written)

    # -- judging and undoing ------------------------------------------------------------
    def by_trace(self, value, contents) -> bool:
        """Whether the trace made a change to `value` that is still there."""
        key = id(value)
        if isinstance(value, list):
            return key in self.touched or (key in self.appended and _appended_to(value, contents))
        if not self.opcodes and not isinstance(value, set):
            return True  # a `d[k] = v` or `obj.n = v` shows in no call: any change counts
        if isinstance(value, set):
            return any((item in value) != (item in contents) for item in self.keys.get(key, ()))
        entries = value if isinstance(value, dict) else vars(value)
        return any(entries.get(k, _Writes) is not contents.get(k, _Writes) for k in self.keys.get(key, ()))

    def undo(self, value, contents) -> None:
        """Put back what the trace changed in `value`; another thread's changes stay."""
        key = id(value)
        if isinstance(value, list):
            if key in self.touched:
                value[:] = contents
            else:
                self.undo_appends(value)
        elif isinstance(value, set):
            for item in self.keys.get(key, ()):
                (value.add if item in contents else value.discard)(item)
        elif not self.opcodes:
            if self.by_trace(value, contents):
                entries = value if isinstance(value, dict) else vars(value)
                entries.clear()
                entries.update(contents)
        else:
            entries = value if isinstance(value, dict) else vars(value)
            _put_back(entries, contents, self.keys.get(key, ()))

    def undo_appends(self, value: list) -> None:
        for item in reversed(self.appended.get(id(value), [])):
            for i in range(len(value) - 1, -1, -1):
                if value[i] is item:
                    del value[i]
                    break


# the frames not followed bytecode by bytecode: torch's and minicomp's
_PACKAGES = tuple(
    os.path.join(os.path.dirname(path), "") for path in (torch.__file__, os.path.dirname(guards.__file__))
)
_SETTERS = (setattr, delattr)
# bytecodes that write into the object on the stack: stores and deletes of items and attributes
_WRITE_OPS = frozenset(
    dis.opmap[name]
    for name in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_ATTR", "DELETE_ATTR", "STORE_SLICE")
    if name in dis.opmap
)
_BINARY_OP = dis.opmap.get("BINARY_OP", -1)  # its in-place forms (`+=`, `|=`) may extend a list, update a dict or set
_INPLACE_ARGS = frozenset(i for i, (name, _) in enumerate(getattr(dis, "_nb_ops", ())) if name.startswith("NB_INPLACE"))


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
