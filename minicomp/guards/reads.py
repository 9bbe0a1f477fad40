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

and `values()` reads them all again (a dict lookup each), for the key a call
checks (key.py `state_key`). Library functions and modules (torch, math,
...) are not walked: they are part of the installed version.
"""

from __future__ import annotations

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

    def __init__(self, *fns):
        self.places: list[tuple[dict, str]] = []
        self.cells: list = []
        seen: set[int] = set()
        for fn in fns:
            self._walk(fn, seen, 0)
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
        return [f"the global {name!r}" for _, name in self.places] + cells

    def values(self) -> list:
        """The values now, in order (MISSING where a name is gone or a cell is empty)."""
        values = list(map(dict.get, self._spaces, self._names, self._missing))
        if self.cells:
            try:
                values += map(_CONTENTS, self.cells)
            except ValueError:  # an empty cell
                values = values[: len(self.places)] + [cell_contents(cell) for cell in self.cells]
        return values
