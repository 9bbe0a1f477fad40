"""Graphs with dynamic shapes, compiled once per concrete shape.

Dynamo marks a dimension dynamic when a compiled function is called with a second
size of it (automatic dynamic shapes, or `torch.compile(dynamic=True)`): the graphs
AOTAutograd then hands the backend have symbolic sizes (`s0`), integer inputs for
them, and a forward that returns sizes for its backward. minicomp's kernels are
written for static shapes.

`Specializing` compiles it per call signature instead, as `minicomp.jit` compiles
a function: the first call with new sizes (each tensor's shape, strides, dtype
and device; each integer's value) makes the graph concrete for those values
(`concrete`: the symbols become numbers, the integer inputs constants), by
substitution into the symbolic graph where every symbol is bound by an input
(`substituted`, no trace), else by tracing it again (`retraced`, make_fx on fake
tensors), and compiles that static graph; later calls with the same sizes go
straight to it.
The kernels of all sizes belong to one set of kernel families
(codegen/families.py), so a new size reuses the text, and the Triton binary, of
kernels whose sizes are runtime arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.fx

from minicomp import config, gc_pause, logs
from minicomp.capture.call_signatures import LastCall, signature

Signature = tuple


def is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """Does an input of `gm` have a symbolic size, stride or value?"""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor):
            numbers = (*value.shape, *value.stride(), value.storage_offset())
            if any(isinstance(n, torch.SymInt) for n in numbers):
                return True
    return False


def concrete(
    gm: torch.fx.GraphModule, args: list, restrided: frozenset[str] = frozenset()
) -> tuple[torch.fx.GraphModule, list[int]]:
    """`gm` for these call values: (a graph whose inputs are the tensor arguments only, with every
    size a number, and the positions of those arguments in `args`). By substitution (`substituted`)
    where it applies, else traced again (`retraced`)."""
    try:
        return substituted(gm, args, restrided)
    except NotSubstitutable as why:
        logs.recompiles.info("%s: traced again for the new sizes (%s)", _graph_name(gm), why)
        return retraced(gm, args)


class NotSubstitutable(Exception):
    """A dynamic graph that `substituted` cannot make concrete (the trace again can)."""


class _Sized(torch.Tensor):
    """The value of a node of a concrete graph: a shape, strides, dtype and device, no data."""

    @staticmethod
    def __new__(cls, shape, stride, offset, dtype, device):
        return torch.Tensor._make_wrapper_subclass(cls, shape, stride, offset, dtype=dtype, device=device)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotSubstitutable(f"{func} called on a node's value")


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def substituted(
    gm: torch.fx.GraphModule, args: list, restrided: frozenset[str] = frozenset()
) -> tuple[torch.fx.GraphModule, list[int]]:
    """`gm` with each symbol replaced by its value in this call, without tracing: each symbol is
    bound from an input whose size (or integer value) is that bare symbol; every input's shape,
    strides and offset must then equal the graph's expressions for them (else NotSubstitutable);
    a node computing a size becomes its number wherever it is used, each other node keeps its op
    and gets its value's shape and strides evaluated. The symbolic trace took every branch on
    sizes under a guard Dynamo checks before this graph runs, so this is the graph a trace on
    these values records (the same ops, sizes and layouts), at a fraction of a trace's cost.
    `restrided`: inputs whose shape alone is compared, given the graph's layout (a backward's
    saved value that its forward laid out otherwise: the compile lays the graph out for it and
    conforms the call's value: dispatch/sized_contracts.py)."""
    placeholders = _placeholders(gm, args)
    number = _evaluator(_bound(placeholders, args, restrided))
    for node, arg in zip(placeholders, args):
        for symbolic, actual in _numbers(node.meta.get("val"), arg, node.name in restrided):
            if number(symbolic) != actual:
                raise NotSubstitutable(f"input {node.name} is laid out unlike the graph's inputs")

    def value_of(val):
        if isinstance(val, torch.Tensor):
            shape = [number(n) for n in val.shape]
            stride = [number(n) for n in val.stride()]
            return _Sized(shape, stride, number(val.storage_offset()), val.dtype, val.device)
        if isinstance(val, (tuple, list)):
            return type(val)(value_of(v) for v in val)
        return number(val)

    graph, env, positions = torch.fx.Graph(), {}, []
    for i, (node, arg) in enumerate(zip(placeholders, args)):
        if isinstance(arg, torch.Tensor):
            env[node] = graph.placeholder(node.name)
            own = node.name in restrided  # (the graph's layout: this call's is conformed to it)
            layout = value_of(node.meta["val"]) if own else arg
            offset = layout.storage_offset()
            env[node].meta["val"] = _Sized(layout.shape, layout.stride(), offset, arg.dtype, arg.device)
            positions.append(i)
        else:
            env[node] = arg
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        val = node.meta.get("val")
        if node.op == "call_function" and _numbers_only(val):
            env[node] = value_of(val)  # a size (or numbers computed from sizes): a constant now
            continue
        new_args = torch.fx.node.map_aggregate(torch.fx.node.map_arg(node.args, env.__getitem__), number)
        new_kwargs = torch.fx.node.map_aggregate(torch.fx.node.map_arg(node.kwargs, env.__getitem__), number)
        if node.op == "call_function" and val is None and not _has_node((new_args, new_kwargs)):
            node.target(*new_args, **new_kwargs)  # a check of sizes (`_assert_scalar`): made now, as a trace would
            continue
        new = graph.node_copy(node, lambda n: env[n])
        new.args, new.kwargs = new_args, new_kwargs
        new.meta = {"val": value_of(val)} if "val" in node.meta else {}
        env[node] = new
    return _lazy_module(gm, graph), positions


def _lazy_module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule of `graph` whose Python code is generated at its first run: a static graph is
    read node by node, and runs only as a fallback (about half of a substitution's time went to
    generating and compiling code no one ran). torch's own lazy module where it has one."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule, _make_graph_module
    except ImportError:  # (a private module: another torch may lack it)
        return torch.fx.GraphModule(root, graph)
    return _make_graph_module(root, graph, graph_module_cls=_LazyGraphModule)


def _placeholders(gm: torch.fx.GraphModule, args: list) -> list[torch.fx.Node]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise NotSubstitutable("the call's arguments do not match the graph's inputs")
    return placeholders


def _bound(placeholders: list[torch.fx.Node], args: list, restrided: frozenset[str] = frozenset()) -> dict:
    """{symbol: its value in this call} for each symbol that is an input's size (or value) bare
    (`restrided`: inputs whose shape alone binds)."""
    import sympy

    bound: dict = {}
    for node, arg in zip(placeholders, args):
        for symbolic, actual in _numbers(node.meta.get("val"), arg, node.name in restrided):
            if isinstance(symbolic, _SYMBOLIC) and isinstance(symbolic.node.expr, sympy.Symbol):
                bound.setdefault(symbolic.node.expr, actual)
    return bound


def _evaluator(bound: dict) -> Callable:
    """number(value): a symbolic value's number where the symbols take their `bound` values (a
    plain value as it is); NotSubstitutable where it has another symbol."""
    import sympy

    memo: dict = {}

    def number(value):
        if not isinstance(value, _SYMBOLIC):
            return value
        expr = (type(value), value.node.expr)
        if expr not in memo:
            result = value.node.expr.xreplace(bound) if isinstance(value.node.expr, sympy.Basic) else value.node.expr
            if isinstance(result, sympy.Basic) and result.free_symbols:
                raise NotSubstitutable(f"{value.node.expr} is not a function of the inputs' sizes")
            kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
            memo[expr] = kind(result)
        return memo[expr]

    return number


PROBE_STEP = 16  # a probe size is the call's +- this: the same residue mod 16 (divisibility by 2, 4, 8, 16)


def probe_value(n: int) -> int:
    """Another value of a size now `n` that kernels are written for alike: `n` -+ PROBE_STEP, the one
    in `n`'s power-of-two bucket (runtime/size_classes.py: what tile and launch choices go by) and
    at least 2; `n` itself where neither is."""
    for other in (n - PROBE_STEP, n + PROBE_STEP):
        if other >= 2 and (other - 1).bit_length() == (n - 1).bit_length():
            return other
    return n


def probe_args(gm: torch.fx.GraphModule, args: list) -> list | None:
    """This call's arguments with every symbol of `gm` at its `probe_value` (tensors as shapes and
    strides only), or None where no symbol takes another value. NotSubstitutable where a size is
    not a function of the symbols the inputs bind."""
    placeholders = _placeholders(gm, args)
    bound = _bound(placeholders, args)
    probe = {
        symbol: probe_value(n) if isinstance(n, int) and not isinstance(n, bool) else n for symbol, n in bound.items()
    }
    if probe == bound:
        return None
    number = _evaluator(probe)
    probed = []
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            shape, stride = [number(n) for n in val.shape], [number(n) for n in val.stride()]
            probed.append(_Sized(shape, stride, number(val.storage_offset()), arg.dtype, arg.device))
        else:
            probed.append(number(val) if isinstance(val, _SYMBOLIC) else arg)
    return probed


def _numbers(val, arg, shape_only: bool = False):
    """(symbolic, actual) pairs of an input's sizes, strides and offset (an integer input: its value)."""
    if isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
        if val.dim() != arg.dim():
            raise NotSubstitutable("an input of another rank")
        yield from zip(val.shape, arg.shape)
        if shape_only:
            return
        yield from zip(val.stride(), arg.stride())
        yield val.storage_offset(), arg.storage_offset()
    elif isinstance(val, _SYMBOLIC):
        yield val, arg
    elif isinstance(val, torch.Tensor) or isinstance(arg, torch.Tensor):
        raise NotSubstitutable("a tensor where the graph has a number, or the reverse")


def _numbers_only(val) -> bool:
    """Is `val` a number, or a tuple or list of numbers (no tensor, no None)?"""
    if isinstance(val, (tuple, list)):
        return bool(val) and all(_numbers_only(v) for v in val)
    return isinstance(val, (*_SYMBOLIC, int, float, bool))


def _has_node(value) -> bool:
    found = []
    torch.fx.node.map_arg(value, found.append)
    return bool(found)


def _graph_name(gm: torch.fx.GraphModule) -> str:
    return type(gm).__name__


RETRACED = "minicomp_retraced"  # a static graph's meta: traced again, its nodes named anew (not `gm`'s names)


def retraced(gm: torch.fx.GraphModule, args: list) -> tuple[torch.fx.GraphModule, list[int]]:
    """`gm` traced again on these call values (make_fx on fake tensors), as `concrete` returns it.
    Its nodes are named anew (marked `RETRACED`): a name of `gm`'s may be another value there."""
    from torch.fx.experimental.proxy_tensor import make_fx

    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    values = list(args)

    def run(*tensors):
        full = list(values)
        for i, t in zip(positions, tensors):
            full[i] = t
        return torch.fx.Interpreter(gm).run(*full)

    with torch.no_grad():  # an AOTAutograd graph is already its forward or its backward
        static = make_fx(run, tracing_mode="fake", _allow_non_fake_inputs=True)(*[args[i] for i in positions])
    static.meta[RETRACED] = True
    return static, positions


class Specializing:
    """A boxed callable (AOTAutograd's convention: it takes the argument list and empties it)
    that runs `gm` through one compiled static graph per call signature.

    `compile_static(static_gm, input_names)` compiles one; `input_names` are `gm`'s own names of
    the tensor inputs, so what the caller knows by name (a backward's saved activations) keeps
    its name. A signature that fails to compile runs `gm` as captured (`fail(err)` decides: the
    fallback policy).

    `write_static(static_gm, input_names)`, where given (config "probe_sizes"), writes one's
    kernels without compiling them (pipeline.write_graph): before the first size (the first whose
    sizes can move), the graph is written at a probe size (`probe_args`), so every kernel family
    that size starts has already seen a second member there, and takes that size's own text as
    its template, sizes that differ made runtime arguments (codegen/families.py). The next sizes then find a
    compiled kernel instead of widening the family, a Triton compile each. The probe only
    decides which literals become runtime arguments: a member is served the template only where
    its own text reads the same, so a probe size Dynamo's guards would refuse costs nothing
    but the probe's time. The caller writes it without timing matmul choices (its shapes may be
    of a class no real size reaches) and marks its kernels as never compiled (families.py).

    `restrided`: inputs made concrete at the graph's own layout whatever strides they arrive in
    (`substituted`): a backward's saved values its forward lays out as its plan has them."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        compile_static: Callable,
        fail: Callable[[Exception], None],
        write_static: Callable | None = None,
        restrided: frozenset[str] = frozenset(),
    ):
        self.gm = gm
        self.restrided = restrided  # inputs made concrete at the graph's layout (`substituted`)
        self.compile_static = compile_static
        self.write_static = write_static
        self.fail = fail
        self.names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.entries: dict[Signature, Callable] = {}
        self.limit = config.cache_limit()  # sizes kept, as minicomp.jit keeps signatures (oldest dropped)
        self._lock = threading.Lock()  # a GPU backward runs on autograd's thread
        self._last: LastCall | None = None  # the last call's signature, checked first
        self._boxed_call = True  # AOTAutograd's mark (on the instance: functools.wraps copies __dict__)

    def __call__(self, args: list):
        values = list(args)
        args.clear()
        last = self._last
        if last is not None and last.matches(values):  # (a loop's next call: its sizes as the last one's)
            return last.entry(values)
        key = tuple(signature(v) for v in values)
        entry = self.entries.get(key)
        if entry is None:
            with self._lock:
                entry = self.entries.get(key) or self._build(values)
                if key not in self.entries and len(self.entries) >= self.limit:
                    self.entries.pop(next(iter(self.entries)))
                self.entries[key] = entry
        self._last = LastCall.of(values, entry)
        return entry(values)

    def _build(self, values: list) -> Callable:
        try:
            with gc_pause.paused(config.get("pause_gc")):
                if self.write_static is not None:
                    self._probe(values)
                static, positions = concrete(self.gm, values, self.restrided)
                boxed = self.compile_static(static, [self.names[i] for i in positions])
        except Exception as err:  # noqa: BLE001 - this size runs as captured, by the fallback policy
            self.fail(err)
            return lambda values: self.gm(*values)

        def run(values: list):
            tensors = [values[i] for i in positions]
            values.clear()  # the compiled module frees each input at its last use
            return boxed(tensors)

        return run

    def _probe(self, values: list) -> None:
        """The graph written once at `probe_args` of these values; where none of their sizes can
        move, the probe is left for a later size (the families that size starts are its to widen)."""
        try:
            args = probe_args(self.gm, values)
            if args is None:
                return
            write, self.write_static = self.write_static, None  # (once)
            static, positions = substituted(self.gm, args)
            write(static, [self.names[i] for i in positions])
            logs.recompiles.info("%s: written at a probe size first", _graph_name(self.gm))
        except Exception as err:  # noqa: BLE001 - the probe only saves later compiles
            self.write_static = None
            logs.recompiles.info("%s: no probe size (%s: %s)", _graph_name(self.gm), type(err).__name__, err)
