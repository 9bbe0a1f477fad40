"""The Python lines of a generated `call` that are not kernel launches: extern ATen calls,
their arguments as literals, and the `del` of each buffer after its last use."""

from __future__ import annotations

import copy
import operator
import re

import torch

from minicomp.ir import Ref


def freed(lines: list[str], uses: list[set[str]], graph) -> list[str]:
    """`lines` with a `del` after the last line that touches each intermediate buffer, as
    Inductor's wrapper does: a local lives until `call` returns, so without it the peak memory
    of a call is the sum of all its intermediates. Inputs go too (`call_boxed` empties its
    argument list: a backward's saved activations are freed as it goes); outputs are left alone."""
    kept = {o for o in graph.outputs if isinstance(o, str)}
    last = {}
    for i, names in enumerate(uses):
        for name in names:
            last[name] = i
    dying: dict[int, list[str]] = {}  # line -> the names it uses last
    for name, at in last.items():
        if name not in kept:
            dying.setdefault(at, []).append(name)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        dead = sorted(dying.get(i, ()))
        if dead:
            out.append(f"del {', '.join(dead)}")
    return out


def safe_name(text: str) -> str:
    """A user's name (a function's __name__) as it may appear in generated text: [A-Za-z0-9_]."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)[:80] or "fn"


def doc_line(line: str) -> str:
    """A line for the module's docstring: no backslash escapes, no closing quotes."""
    return line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


# view ops not made from their root buffer (codegen/view_layouts.py), called as the tensor's method:
# the same ATen op without the OpOverload's Python call
VIEWS = {"aten.view.default": "view", "aten.permute.default": "permute", "aten.unsqueeze.default": "unsqueeze"}


def extern_line(node, rename: dict[str, str] | None = None, bound: str | None = None) -> str:
    """The line of `call` that runs extern node `node` through ATen (`rename`: values passed
    under another local's name, as an attention mask copied into the layout SDPA needs; `bound`:
    the Python binding it calls, codegen/aten_bindings.py, else its OpOverload's `_op`)."""
    if rename:
        node = copy.copy(node)
        node.args, node.kwargs = _renamed(node.args, rename), _renamed(node.kwargs, rename)
    if node.target is operator.getitem:
        return f"{node.name} = {render_arg(node.args[0])}[{node.args[1]!r}]"
    if method_view(node):
        return f"{node.name} = {node.args[0].name}.{VIEWS[str(node.target)]}({render_arg(node.args[1])})"
    target = node.target
    if bound is not None:
        call = bound
    elif isinstance(target, torch._ops.OpOverload):
        call = f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    else:
        call = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
    if not DOTTED.fullmatch(call):
        raise NotImplementedError(f"cannot call {call!r} from generated code")
    if bound is None and isinstance(target, torch._ops.OpOverload):
        call += "._op"  # its C++ operator: OpOverload.__call__ is one Python frame around it (0.3 us)
    args = [render_arg(a) for a in node.args] + [f"{k}={render_arg(v)}" for k, v in node.kwargs.items()]
    named = f"  # binding of {target}" if bound is not None else ""  # (the op it runs, by its ATen name)
    return f"{node.name} = {call}({', '.join(args)}){named}"


def method_view(node) -> bool:
    """Whether extern node `node` is a view op its line calls as the tensor's method."""
    return str(node.target) in VIEWS and not node.kwargs and len(node.args) == 2 and isinstance(node.args[0], Ref)


def _renamed(value, rename: dict[str, str]):
    if isinstance(value, Ref):
        return Ref(rename.get(value.name, value.name))
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed(v, rename) for v in value)
    if isinstance(value, dict):
        return {k: _renamed(v, rename) for k, v in value.items()}
    return value


def conform_line(node) -> str:
    """The line after extern node `node` that holds its real output to the shape and strides the
    plan read from its meta kernel (runtime/externs.py): a tuple comparison, a copy when they differ."""
    name, meta = node.name, node.meta
    layout = f"({tuple(meta.shape)}, {tuple(meta.stride)})"
    if node.target is operator.getitem and isinstance(node.args[0], Ref):
        op = f"{node.args[0].name}[{node.args[1]!r}]"
    else:
        op = str(node.target)
    return f"if ({name}.shape, {name}.stride()) != {layout}: {name} = conform({name}, *{layout}, {op!r})"


DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
SIMPLE = (type(None), bool, int, float, complex, str)


def render_arg(value) -> str:
    """An FX argument as Python source inside the wrapper (only values with a literal form)."""
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(render_arg(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f'float("{value}")'
    if type(value) not in SIMPLE:
        raise NotImplementedError(f"an argument of type {type(value).__name__} has no literal form")
    return repr(value)
