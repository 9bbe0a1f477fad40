"""`minicomp.jit(module)`: an nn.Module whose forward runs compiled.

The module's parameters and buffers are passed to the compiled function as
inputs (torch.func.functional_call), never baked in as constants: an optimizer
step is seen by the next call, and gradients reach the parameters through the
compiled backward. A call gathers them by name in one walk (`named_state`) and
flattens `(state, *args)` without pytree where its arguments are plain
(arguments.py); after a trace every submodule's tables are put back
entry by entry (`_tables_kept`: a submodule under two names kept traced tensors).

Everything else the forward reads from the module is guarded (`ModuleContext`):
each call's key holds every submodule's training flag and plain attributes
(numbers, strings, flags, tuples of them; a tensor attribute by identity; an
object attribute such as a config by its own plain attributes) and the forward
hooks, and the values its classes' methods read (globals, closure cells: reads.py),
so `.eval()`, `self.p = 0.1`, `self.cache = new_table` or a new hook compile anew. Across
processes a module is identified by its classes' code (fingerprint.of_module)
plus that same state. A forward that changes its own attributes (`self.k += 1`)
runs eagerly: compiled code would not repeat the change.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch.func import functional_call

from minicomp import guards
from minicomp.dispatch.function import JitFunction
from minicomp.guards import fingerprint, reads
from minicomp.guards.context import Held, _put_back, changed_read
from minicomp.guards.read_keys import ReadKeys

# nn.Module's own bookkeeping: parameters, buffers and submodules reach the trace another way
_INTERNAL = {
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_is_full_backward_hook",
    "_compiled_call_impl",
}
_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


class ModuleContext:
    """The module state a compiled forward depends on (context.FunctionContext's counterpart)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        classes = {type(m) for m in module.modules() if not reads.is_library(type(m))}
        methods = [f for c in classes for k in c.__mro__ if not reads.is_library(k) for f in vars(k).values()]
        functions = [f for f in methods if isinstance(f, types.FunctionType)]
        self.reads = reads.Reads(*functions, classes=classes)  # `self.act` rebound on the class is seen
        self._keys = ReadKeys()  # their keys, reused where they cannot have changed

    def state(self) -> tuple:
        """Checked on every call: the training flags and plain attributes of every submodule, and
        what the methods of the user's module classes read (globals, closures: reads.py)."""
        memo = {}  # user objects keyed so far (guards.state_key): a config object many submodules hold
        modules = tuple(_module_key(m, memo) for m in self.module.modules())
        return modules + self._keys(self.reads.values(), memo)

    def describe(self, old: tuple, new: tuple) -> str:
        (old_modules, old_read), (new_modules, new_read) = self.split(old), self.split(new)
        if old_modules != new_modules:
            return "module state (a training flag, an attribute or a hook) changed"
        return changed_read(self.reads, old_read, new_read)

    def split(self, state: tuple) -> tuple[tuple, tuple]:
        """(the submodules' keys, the values their methods read): a key on disk holds the first,
        the fingerprint (of_module: every class's methods and what they read) covers the second."""
        count = len(state) - len(self.reads)
        return state[:count], state[count:]

    def fingerprint(self) -> str | None:
        return fingerprint.of_module(self.module)

    def snapshot(self):
        modules = [(m, dict(vars(m))) for m in self.module.modules()]
        attributes = [
            (f"the attribute {name!r} of its {type(m).__name__}", value)
            for m, attrs in modules
            for name, value in attrs.items()
            if name not in _INTERNAL
        ]
        held = Held(attributes + list(zip(self.reads.names(), self.reads.values())))
        return modules, self.state(), held, _hooks(modules)

    def changed(self, before) -> str | None:
        modules, state, held, hooks = before
        inside = held.changed()  # a list attribute appended to, a config object's counter
        if inside is not None:
            return inside
        for m, name, table, entries in hooks:
            if list(table.items()) != entries:
                return f"the {name} of its {type(m).__name__}"
        if self.state() == state:
            return None
        for m, attrs in modules:
            now = vars(m)
            for name in set(attrs) | set(now):
                if name not in _INTERNAL and attrs.get(name, attrs) is not now.get(name, attrs):
                    return f"the attribute {name!r} of its {type(m).__name__}"
        return "the state of its submodules"

    def restore(self, before) -> None:
        for m, attrs in before[0]:
            _put_back(vars(m), attrs)  # an attribute another thread set stays
        before[2].restore()
        for _, _, table, entries in before[3]:  # a hook the trace registered (transformers' output capture)
            if list(table.items()) != entries:
                table.clear()
                table.update(entries)


def _hooks(modules) -> list[tuple]:
    """(module, name, its hook table, the table's entries) of every hook table of `modules`: an
    OrderedDict the trace may register a hook in, which `Held` (plain containers only) does not copy."""
    return [
        (m, name, attrs[name], list(attrs[name].items()))
        for m, attrs in modules
        for name in _HOOKS + ("_backward_hooks", "_backward_pre_hooks")
        if isinstance(attrs.get(name), dict)
    ]


def _module_key(m: torch.nn.Module, memo: dict | None = None) -> tuple:
    parts = [type(m)]
    for name, value in vars(m).items():
        if name in _INTERNAL:
            continue
        if name in _HOOKS:
            if value:
                parts.append((name, tuple(guards.ByIdentity(hook) for hook in value.values())))
            continue
        parts.append((name, guards.state_key(value, 0, memo)))
    return tuple(parts)


class JitModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, fallback: str | None = None, cuda_graphs: bool | None = None):
        super().__init__()
        self.module = module
        self.compiled = JitFunction(
            self._forward,
            fallback,
            name=type(module).__name__,
            context=ModuleContext(module),
            cuda_graphs=cuda_graphs,
            state_first=True,
        )

    def _forward(self, state, *args, **kwargs):
        with _tables_kept(self.module):
            return functional_call(self.module, state, args, kwargs)

    def forward(self, *args, **kwargs):
        return self.compiled(named_state(self.module), *args, **kwargs)


@contextlib.contextmanager
def _tables_kept(module: torch.nn.Module):
    """Every submodule's parameter and buffer tables put back as they were after the block, entry
    by entry: functional_call left a submodule registered under two names (`self.b = self.a`) with
    the traced tensors in it (its restore saved the second name's entry after the first had swapped
    it), and the caller's module then held FunctionalTensors."""
    tables = [(table, dict(table)) for m in module.modules() for table in (m._parameters, m._buffers)]
    try:
        yield
    finally:
        for table, saved in tables:
            for name, value in saved.items():
                if table.get(name) is not value:
                    table[name] = value


def named_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`dict(module.named_parameters())` updated with `module.named_buffers()` (each tensor once,
    under its first name, parameters first), from one walk of the submodules instead of two."""
    parameters: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    seen_parameters: set[int] = set()
    seen_buffers: set[int] = set()
    for prefix, m in module.named_modules():
        dot = prefix + "." if prefix else ""
        for found, seen, table in ((parameters, seen_parameters, m._parameters), (buffers, seen_buffers, m._buffers)):
            for name, t in table.items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    found[dot + name] = t
    parameters.update(buffers)
    return parameters
