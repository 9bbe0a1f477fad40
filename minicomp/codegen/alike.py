"""Kernels alike but for their names: one `Launch` for all of them in a module.

A model's identical layers plan identical kernels, but each kernel's text names
its values after the FX nodes it computes (`mul_33`, `add_2074_ptr`) and
itself after its ops and position (`mc_fused_..._8`): eight layers' RMSNorm
backward kernels are eight texts, so eight Triton compiles and eight tunings
on a GPU. Two kernel texts that differ only by a consistent renaming of what
the kernel itself defines (its functions, its positional parameters, the
names it assigns) compute the same thing from the same positional arguments,
so they compile to the same binary. `key` is that text with those names
numbered in order of first use, breadth first through its syntax tree (an order
the structure alone fixes), and everything else as written (the global
names it calls, constants, the launch spec, parameters passed by keyword).
The module then makes one `Launch` and binds later equal kernels' launchers
to it (`launch_8 = launch_4`), and a kernel is compiled and tuned once per
distinct kernel, not once per layer.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re


def key(text: str) -> str | None:
    """`text` (one kernel's module-level source: its comment, its @triton.jit functions and its
    `Launch` line) with every name it defines renamed canonically, as a SHA-256; None when it does
    not parse. The comment is left out; the functions' part is memoized by its text (at a new
    size, a family's kernel is the last size's text: only its launch line, which holds the sizes
    of its grid, is new)."""
    code = [line for line in text.strip().splitlines() if not line.startswith("#")]
    at = max((i for i, line in enumerate(code) if _LAUNCH.match(line)), default=None)
    if at is None:
        return None
    functions = _functions("\n".join(code[:at]))
    if functions is None:
        return None
    digest, names = functions
    canonical = {name: f"_f{i}" for i, name in enumerate(names)}
    target = _LAUNCH.match(code[at]).group(1)
    launch = _LAUNCH.sub("_launcher = Launch(", code[at], count=1)
    launch = _IDENTIFIER.sub(lambda m: canonical.get(m.group(), m.group()), launch)
    if target in names or len(code) != at + 1:
        return None
    return hashlib.sha256(f"{digest}\n{launch}".encode()).hexdigest()


class Alike:
    """One module's kernels by alikeness: which earlier kernel's `Launch` each one binds to.

    A kernel's `key` (a parse of its text) is computed only once an earlier kernel of the same
    launch signature has the same text with every identifier blanked and its comment lines
    dropped, which two kernels of one key always have: a module whose kernels all differ parses
    none of them (a first call's codegen spent about a quarter of its time in `key`)."""

    def __init__(self):
        self._blanked: dict[tuple, list[list]] = {}  # (blanked text, signature) -> [[text, launcher, key]]
        self._first: dict[tuple, str] = {}  # (key, signature) -> the first launcher of that key

    def first(self, text: str, signature: tuple, launcher: str) -> str:
        """The launcher `launcher`'s kernel binds to: the first kernel alike to it, else itself."""
        bucket = self._blanked.setdefault((_blank(text), signature), [])
        bucket.append([text, launcher, _UNKEYED])
        if len(bucket) == 1:
            return launcher
        for entry in bucket:  # in order: an earlier kernel is registered first
            if entry[2] is _UNKEYED:
                entry[2] = key(entry[0])
                if entry[2] is not None:
                    self._first.setdefault((entry[2], signature), entry[1])
        same = bucket[-1][2]
        return launcher if same is None else self._first[(same, signature)]


_UNKEYED = object()


def _blank(text: str) -> str:
    """`text` without its comment lines, every identifier as `_`."""
    code = "\n".join(line for line in text.strip().splitlines() if not line.startswith("#"))
    return blanked(code)


def blanked(text: str) -> str:
    """`text` with every identifier as `_`: two texts one of which is the other with names changed
    blank alike."""
    return _IDENTIFIER.sub("_", text)


def renamed_digest(text: str) -> str | None:
    """SHA-256 of the functions in `text` with the names they define numbered in order of first
    use (what `key` compares), None when it does not parse (codegen/families.py's members)."""
    functions = _functions(text)
    return None if functions is None else functions[0]


_LAUNCH = re.compile(r"^(\w+) = Launch\(")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@functools.lru_cache(maxsize=4096)
def _functions(text: str) -> tuple[str, tuple[str, ...]] | None:
    """(SHA-256 of `text`'s functions with the names they define numbered, their own names in
    order), None when it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if not all(isinstance(node, ast.FunctionDef) for node in tree.body):
        return None
    nodes = list(ast.walk(tree))  # breadth first: an order fixed by the structure, as the numbering needs
    defined = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    for node in tree.body:
        defined.add(node.name)
        defined.update(a.arg for a in node.args.args if a.annotation is None)  # keyword-passed constexprs keep theirs
    names = tuple(node.name for node in tree.body)
    numbers: dict[str, str] = {name: f"_f{i}" for i, name in enumerate(names)}

    def canonical(name: str) -> str:
        if name not in defined:
            return name
        return numbers.setdefault(name, f"_v{len(numbers)}")

    for node in nodes:
        if isinstance(node, ast.Name):
            node.id = canonical(node.id)
        elif isinstance(node, ast.arg):
            node.arg = canonical(node.arg)
        elif isinstance(node, ast.FunctionDef):
            node.name = canonical(node.name)
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest(), names
