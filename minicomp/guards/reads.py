"""What a function reads from Python state, and a key of it that a call can check.

A trace bakes in every Python value the function reads outside its arguments:
`x * SCALE` compiles `SCALE`'s value into the kernel. So a compiled entry is
valid only while those values stay what they were. `Reads` lists where a
function's values come from, once per trace:

  * each global its code names (through nested code), in its module's namespace;
  * its closure cells;
  * the same, recursively, for the user functions it names or closes over
    (`helper(x)` reading `EPS`), and each attribute a user module it names may
    provide (`cfg.SCALE`);
  * the default arguments of those helpers (`helper(x)` with `k=2.0`): not those of the
    function whose arguments the caller binds (`bound`: its defaults are in the arguments);
  * for `classes` (a bound method's, a module's), their methods' reads and each class
    attribute the code may look up through `self` (`self.act(x)`: `Cls.act` rebound is seen);

and `values()` reads them all again (a dict lookup each), for the key a call
checks (key.py `state_key`). Library functions and modules (torch, math,
...) are not walked: they are part of the installed version.
"""

from __future__ import annotations

import functools
import operator
import types

import torch

LIBRARIES = ("torch", "triton", "numpy", "math", "operator", "functools", "builtins", "minicomp", "einops")
_DEPTH = 4  # user functions followed, one through another
MISSING = object()  # a global that is not (or no longer) defined, or an empty cell
_CONTENTS = operator.attrgetter("cell_contents")


def is_library(value) -> bool:
    """A library function, builtin, class or ATen op: named, never instances with state."""
    named = (types.FunctionType, types.BuiltinFunctionType, type, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
    module = getattr(value, "__module__", None) or ""
    return isinstance(value, named) and module.split(".")[0] in LIBRARIES


def code_names(code: types.CodeType) -> set[str]:
    """Every name a code object (and the code nested in it) looks up: globals and attributes."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name not bound yet)
        return MISSING


class Reads:
    """Where the Python values a function reads live: (namespace, name) pairs and closure cells."""

    def __init__(self, *fns, classes=(), bound=None):
        self.places: list[tuple[dict, str]] = []
        self.cells: list = []
        self.more: list[tuple[str, object]] = []  # (what, a getter): class attributes, defaults
        self._bound, self._used = bound, set()  # the code names of every function walked
        seen: set[int] = set()
        classes = [k for cls in classes for k in cls.__mro__ if k is not object and not is_library(k)]
        methods = [m for k in classes for m in vars(k).values()]
        methods = [getattr(m, "__func__", m) for m in methods]  # staticmethod, classmethod
        for fn in list(fns) + [m for m in methods if isinstance(m, types.FunctionType)]:
            self._walk(fn, seen, 0)
        for name in sorted(self._used & {name for k in classes for name in vars(k)}):
            for k in dict.fromkeys(classes):
                getter = functools.partial(vars(k).get, name, MISSING)
                self.more.append((f"the class attribute {k.__qualname__}.{name}", getter))
        unique = {(id(space), name): (space, name) for space, name in self.places}
        self.places = list(unique.values())
        # `values` reads them with map over these (no Python frame per value)
        self._spaces, self._names = [p[0] for p in self.places], [p[1] for p in self.places]
        self._missing = [MISSING] * len(self.places)

    def _walk(self, fn, seen: set[int], depth: int) -> None:
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in seen or depth > _DEPTH:
            return
        seen.add(id(fn))
        names, space = code_names(code), fn.__globals__
        self._used |= names
        if fn is not self._bound and getattr(fn, "__func__", fn) is not getattr(self._bound, "__func__", self._bound):
            for attribute in ("__defaults__", "__kwdefaults__"):
                if getattr(fn, attribute, None) is not None:
                    getter = functools.partial(getattr, fn, attribute)
                    self.more.append((f"the {attribute.strip('_')} of {fn.__qualname__}", getter))
        for cell in fn.__closure__ or ():
            self.cells.append(cell)
            self._follow(cell_contents(cell), names, seen, depth)
        for name in sorted(names & space.keys()):
            self.places.append((space, name))
            self._follow(space[name], names, seen, depth)

    def _follow(self, value, names: set[str], seen: set[int], depth: int) -> None:
        """A user function's own reads; a user module's attributes the code may read."""
        if isinstance(value, types.FunctionType) and not is_library(value):
            self._walk(value, seen, depth + 1)
        elif isinstance(value, types.ModuleType) and value.__name__.split(".")[0] not in LIBRARIES:
            if id(value) not in seen:
                seen.add(id(value))
                space = vars(value)
                self.places.extend((space, name) for name in sorted(names & space.keys()))

    def names(self) -> list[str]:
        """What each of `values` is, in words."""
        cells = [f"a cell it closes over ({cell_contents(c).__class__.__name__})" for c in self.cells]
        return [f"the global {name!r}" for _, name in self.places] + cells + [what for what, _ in self.more]

    def __len__(self) -> int:
        return len(self.places) + len(self.cells) + len(self.more)

    def values(self) -> list:
        """The values now, in order (MISSING where a name is gone or a cell is empty)."""
        values = list(map(dict.get, self._spaces, self._names, self._missing))
        if self.cells:
            try:
                values += map(_CONTENTS, self.cells)
            except ValueError:  # an empty cell
                values = values[: len(self.places)] + [cell_contents(cell) for cell in self.cells]
        if self.more:
            values += [get() for _, get in self.more]
        return values
