"""The module writer's last check: every name a generated function reads is assigned first.

A kernel that reads a temporary its lines assign later, or only inside a loop that may not run,
or only in one branch, fails when it runs (Python's UnboundLocalError in the interpreter, a
Triton compile error on a GPU): after the compile, inside a training step. `check_assigned`
reads the rendered module (Python's `ast`) and, for each function in it, follows its statements
in order: a local name must be assigned on every path to each read (an `if` joins the names both
branches assign; a `for` or `while` body may not run, so what it assigns is its own), and any
other name must be one the module or Python's builtins define. A read that fails raises
`UnassignedName` at compile time, so the dispatch layer's fallback applies (dispatch/fallback.py).

`check_module` does the same piece by piece: each kernel's functions are checked once per text
(a new size of a family writes the last size's functions again, only their launch line differs),
what they read from outside kept (`Outside`) and compared with what the module defines.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

BUILTINS = frozenset(dir(builtins))
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class UnassignedName(NotImplementedError):
    """A generated function reads a name that is not assigned on every path before the read."""


def check_assigned(text: str) -> None:
    """Raise `UnassignedName` for the first read, in any function of the module `text`, of a name
    not assigned on every path before it (a local) or not defined by the module (any other)."""
    tree = ast.parse(text)
    walrus = ":=" in text  # else no expression binds a name: `_stored` walks only targets
    known = BUILTINS | _module_names(tree, walrus)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _Function(node, known, lines, walrus).check()


@dataclass(frozen=True)
class Outside:
    """Of a run of module-level functions: the names they define, and the names they read that
    none of them assigns (the module must define each)."""

    defines: frozenset[str]
    reads: frozenset[str]


def outside(functions: str) -> Outside:
    """What `functions` (module-level source holding only functions and comments) defines and reads
    from the module; raises `UnassignedName` for a local read before it is assigned on every path."""
    tree = ast.parse(functions)
    walrus = ":=" in functions
    lines = functions.splitlines()
    reads: set[str] = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise SyntaxError(f"not a function: line {node.lineno}")
        function = _Function(node, None, lines, walrus)
        function.check()
        reads |= function.outside
    return Outside(frozenset(_module_names(tree, walrus)), frozenset(reads))


def check_module(text: str, pieces: list[str], checked: dict[str, Outside]) -> None:
    """`check_assigned(text)` for a module whose kernels are `pieces` (substrings of `text`, in
    order): each piece's leading functions are checked once per text, top-level comment lines aside
    (`checked` keeps what they read from the module), the rest of the module as a whole. Any
    surprise (a part that does not parse alone, a name the module lacks, a failing function) checks
    `text` whole, which raises the usual error: the first failure in the module's order."""
    try:
        at = text.find(pieces[0]) if pieces else 0  # (the kernels follow the module's header)
        if at < 0:
            raise SyntaxError("a kernel not in the module's text")
        kept, defined, needed = [text[:at]], set(), set()
        for piece in pieces:
            functions = _leading_functions(piece)
            start = text.find(functions, at) if functions else -1
            if start < 0:
                continue
            key = _without_comment_lines(functions)  # (a combined launch's headers name its sizes)
            found = checked.get(key)
            if found is None:
                try:
                    found = checked.setdefault(key, outside(functions))
                except UnassignedName:  # the module's first failure, or its SyntaxError, as a whole check says
                    check_assigned(text)
                    raise
            defined |= found.defines
            needed |= found.reads
            kept.append(text[at:start])
            at = start + len(functions)
        rest = "".join(kept) + text[at:]
        tree = ast.parse(rest)
    except SyntaxError:
        check_assigned(text)
        return
    walrus = ":=" in rest
    known = BUILTINS | _module_names(tree, walrus) | defined
    if not needed <= known:
        check_assigned(text)  # (raises, naming the function and line)
        return
    lines = rest.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _Function(node, known, lines, walrus).check()


def _leading_functions(piece: str) -> str:
    """The start of a kernel's module-level source (codegen/module.py) up to its first top-level line
    that is neither a comment, a decorator nor inside a function: its functions and their comments."""
    lines = piece.splitlines(keepends=True)
    end = 0
    for i, line in enumerate(lines):
        top = line[:1]
        if top and top not in " \t\n#@" and not line.startswith(("def ", "async def ")):
            break
        end = i + 1
    start = 0
    while start < end and lines[start].startswith("#"):  # the kernel's header comment (its values' names)
        start += 1
    while end > start and lines[end - 1].startswith("#"):  # a comment before the launch line
        end -= 1
    body = lines[start:end]
    return "".join(body) if any(line.startswith(("def ", "async def ")) for line in body) else ""


def _without_comment_lines(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def _module_names(tree: ast.Module, walrus: bool) -> set[str]:
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in stmt.names)
        else:
            names.update(_stored(stmt, walrus))
    return names


def _stored(node: ast.AST, walrus: bool = True) -> set[str]:
    """The names `node` binds in its own scope (not inside a nested function or comprehension).
    Without `walrus` (no `:=` in the text) an expression binds a name only as a target, so only
    expressions in a store or delete context are entered: a generated wrapper's long calls are not."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    found, todo = set(), [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            found.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(n.name)
            continue
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update(a.asname or a.name.split(".")[0] for a in n.names)
        if n is not node and isinstance(n, (ast.Lambda, *COMPREHENSIONS)):
            continue
        if not walrus and isinstance(n, ast.expr) and not isinstance(getattr(n, "ctx", None), (ast.Store, ast.Del)):
            continue
        todo.extend(ast.iter_child_nodes(n))
    return found


class _Function:
    """Definite assignment through one function's statements."""

    def __init__(self, fn: ast.FunctionDef, known: set[str] | None, lines: list[str], walrus: bool = True):
        """`known`: the names the module defines; None collects the names read from it in `outside`."""
        self.fn, self.known, self.lines, self.walrus = fn, known, lines, walrus
        self.outside: set[str] = set()
        args = fn.args
        self.params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        self.params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        self.locals = self.params | set().union(*(_stored(s, walrus) for s in fn.body))

    def check(self) -> None:
        self.block(self.fn.body, frozenset(self.params))

    # -- statements: each returns the names assigned after it, or None where no path goes on --------
    def block(self, stmts: list[ast.stmt], defined: set[str] | frozenset[str] | None) -> set[str] | None:
        """The names assigned after `stmts`, run from `defined` (not changed: the block works on a
        copy, which its simple statements extend in place, so a long straight run costs linear time)."""
        defined = None if defined is None else set(defined)
        for stmt in stmts:
            if defined is None:  # after a return or raise: not reached
                return None
            defined = self.statement(stmt, defined)
        return defined

    def statement(self, s: ast.stmt, defined: set[str]) -> set[str] | None:
        """The names assigned after `s`: `defined` itself, extended, for a simple statement."""
        if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            if isinstance(s, ast.AugAssign):
                self.reads(s.target, defined, load_targets=True)
            if s.value is not None:
                self.reads(s.value, defined)
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            for target in targets:
                self.reads(target, defined)  # a subscript's or attribute's base, a starred target's parts
            if s.value is not None:  # (`x: int` binds nothing)
                defined |= _stored(s, self.walrus)
            return defined
        if isinstance(s, (ast.Return, ast.Raise)):
            for child in ast.iter_child_nodes(s):
                self.reads(child, defined)
            return None
        if isinstance(s, ast.Delete):
            for target in s.targets:
                self.reads(target, defined, load_targets=True)
            defined -= _stored_all(s.targets)
            return defined
        if isinstance(s, ast.If):
            self.reads(s.test, defined)
            return _join(self.block(s.body, defined), self.block(s.orelse, defined))
        if isinstance(s, (ast.For, ast.AsyncFor)):
            self.reads(s.iter, defined)
            self.block(s.body, defined | _stored_all([s.target]))  # may run no time: its names stay its own
            return self.block(s.orelse, defined)
        if isinstance(s, ast.While):
            self.reads(s.test, defined)
            self.block(s.body, defined)
            return self.block(s.orelse, defined)
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.reads(item.context_expr, defined)
                if item.optional_vars is not None:
                    defined = defined | _stored_all([item.optional_vars])
            return self.block(s.body, defined)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in s.decorator_list:
                self.reads(d, defined)
            defined.add(s.name)
            return defined
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            defined |= _stored(s, self.walrus)
            return defined
        if isinstance(s, ast.Try):
            body = self.block(s.body, defined)
            ends = [self.block(s.orelse, body) if body is not None else None]
            for handler in s.handlers:
                if handler.type is not None:
                    self.reads(handler.type, defined)
                ends.append(self.block(handler.body, defined | ({handler.name} if handler.name else set())))
            joined = None  # no path yet
            for end in ends:
                joined = _join(joined, end)
            final = self.block(s.finalbody, defined)  # runs on every path, after as little as `defined`
            return None if joined is None or final is None else joined | final
        # a simple statement (an expression, an assert, pass, break); anything else (match) likewise:
        # its reads against what is assigned before it
        for child in ast.iter_child_nodes(s):
            if isinstance(child, ast.expr):
                self.reads(child, defined)
        defined |= _stored(s, self.walrus)
        return defined

    # -- expressions ---------------------------------------------------------------------------------
    def reads(self, node: ast.AST, defined: set[str] | frozenset[str], load_targets: bool = False) -> None:
        """Check every name `node` reads; a target's own names are read only with `load_targets`."""
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) or load_targets:
                self.read(node, defined)
            return
        if isinstance(node, ast.Lambda):
            args = node.args
            for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
                self.reads(default, defined)
            inner = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
            self.reads(node.body, defined | inner)
            return
        if isinstance(node, COMPREHENSIONS):
            for gen in node.generators:
                self.reads(gen.iter, defined)
                defined = defined | _stored_all([gen.target])
                for test in gen.ifs:
                    self.reads(test, defined)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self.reads(part, defined)
            return
        for child in ast.iter_child_nodes(node):
            self.reads(child, defined)

    def read(self, node: ast.Name, defined: set[str] | frozenset[str]) -> None:
        name = node.id
        if name in defined:  # (a comprehension's or lambda's own names too)
            return
        if name in self.locals:
            why = "before it is assigned on every path to it"
        elif self.known is None:
            self.outside.add(name)
            return
        elif name in self.known:
            return
        else:
            why = "which neither the function nor the module defines"
        line = self.lines[node.lineno - 1].strip() if 0 < node.lineno <= len(self.lines) else ""
        line = line if len(line) <= 160 else line[:157] + "..."
        raise UnassignedName(
            f"generated function {self.fn.name} reads {name!r} {why} "
            f"(line {node.lineno - self.fn.lineno} of the function: {line})"
        )


def _stored_all(targets: list[ast.AST]) -> frozenset[str]:
    return frozenset().union(*(_stored(t) for t in targets))


def _join(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """The names assigned after two branches: those both assign (a branch that returns adds no path)."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b
