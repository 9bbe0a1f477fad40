"""A tracer of our own for the common first call: ATen ops recorded on meta tensors that report
the device of the tensors they stand for. No make_fx and no fake tensors, so a process's first
compile does not import torch._dynamo and torch._inductor (make_fx and FakeTensorMode import both
whatever they trace).

It takes what a plain inference function does: pure ATen ops (after the same decompositions as
tracing.py's make_fx path), views, and in-place ops on values the trace itself made (as a
decomposition's `add_`), with no grad, autocast, vmap or user modes on. Anything else raises
`Untraceable` before the op runs, and tracing.py traces with make_fx instead:
    - an op that writes into an argument, a constant, a view or a value already read;
    - an op that reads tensor values (`.item()`, `bool(t)`, `nonzero`: no meta kernel runs them)
      or draws random numbers (the make_fx path decides how those compile);
    - an op with no meta kernel, or tensors of two devices in one op (eager's error comes from
      the make_fx path);
    - Python that reads memory (`.numpy()`, `data_ptr()`: a Triton kernel of the user's).
Nothing real is computed, so nothing the function's tensors hold changes; `context.watch` undoes
what the Python around the ops changed before make_fx traces again.
"""

from __future__ import annotations

import functools
import operator
import sys
import types

import torch
import torch.fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from minicomp import guards

aten = torch.ops.aten


class Untraceable(Exception):
    """What the function does needs make_fx (tracing.py traces it there)."""


class Standin(torch.Tensor):
    """A meta tensor reporting the device of the tensor it stands for, and the graph node that
    computes it. `root` is the argument slot (or CONSTANT) whose memory it shares, None when the
    trace made its memory; `is_view` says it is a view; `aliased` that an alias of it was taken.
    An in-place op may write only into one with none of these and no reader yet (its node has
    no users): anything else needs make_fx's functionalization."""

    meta: torch.Tensor
    node: torch.fx.Node
    root: int | None
    stands_in_a_trace = True  # guards/key.py: a jitted function called with one runs as its code

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device: torch.device, node: torch.fx.Node, root, is_view: bool):
        standin = torch.Tensor._make_wrapper_subclass(
            cls, meta.shape, meta.stride(), meta.storage_offset(), dtype=meta.dtype, device=device
        )
        standin.meta, standin.node, standin.root, standin.is_view = meta, node, root, is_view
        standin.aliased = False  # an alias of it was taken (`aten.alias`: no node; see Recorder)
        return standin

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise Untraceable(f"{func} was called on a traced tensor outside the trace")

    def __repr__(self) -> str:
        return f"Standin({self.dtype}{list(self.shape)}, {self.device})"


CONSTANT = -1  # Standin.root of a tensor the function closes over (a constant of the graph)

# ops eager would run on tensor values; their meta kernels would fail anyway, but the reason
# stays readable this way
_READS_VALUES = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape, torch.Tag.nondeterministic_seeded)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor with t's shape, strides, offset and dtype."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    base = torch.empty((t.storage_offset() + span,), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


class _DisabledOnceLoaded:
    """What a `torch._disable_dynamo` wrapper calls in place of `torch._dynamo.disable(fn)`: `fn`
    itself while torch._dynamo is not loaded (no frame can be under Dynamo then), and exactly
    that disabled function from the first call after it is loaded."""

    def __init__(self, fn, recursive: bool):
        self.fn, self.recursive, self.disabled = fn, recursive, None

    def __call__(self, *args, **kwargs):
        if self.disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None or not hasattr(dynamo, "disable"):
                return self.fn(*args, **kwargs)
            self.disabled = dynamo.disable(self.fn, self.recursive, wrapping=False)
        return self.disabled(*args, **kwargs)


@functools.cache
def _defer_dynamo_imports() -> None:
    """The meta kernels of elementwise ops are torch._refs functions wrapped in
    `torch._disable_dynamo`, which imports torch._dynamo on its first call to make the
    disabled function it keeps in the wrapped function's `__dynamo_disable` slot. That slot is
    filled here, for the wrappers the decomposition and meta tables reach, with a
    `_DisabledOnceLoaded`: the same behaviour, with the import left to whoever loads Dynamo."""
    from torch._decomp import global_decomposition_table

    wrapper_code = torch._compile._disable_dynamo(lambda: None).__code__
    roots = [fn for table in global_decomposition_table.values() for fn in table.values()]
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(("torch._refs", "torch._prims", "torch._decomp")):
            roots += list(vars(module).values())
    seen: set[int] = set()
    stack = [(fn, 0) for fn in roots]
    while stack:
        value, depth = stack.pop()
        if depth > 6 or id(value) in seen:
            continue
        seen.add(id(value))
        if type(value) is types.FunctionType:
            cells = dict(zip(value.__code__.co_freevars, value.__closure__ or ()))
            if value.__code__ is wrapper_code:
                fn = cells["fn"].cell_contents
                if getattr(fn, "__dynamo_disable", None) is None:
                    setattr(fn, "__dynamo_disable", _DisabledOnceLoaded(fn, cells["recursive"].cell_contents))
            for cell in cells.values():
                try:
                    stack.append((cell.cell_contents, depth + 1))
                except ValueError:  # an empty cell
                    pass
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None:
            stack.append((wrapped, depth + 1))


class Recorder(TorchDispatchMode):
    """Records each ATen op called on stand-ins into `graph` (see the module docstring)."""

    def __init__(self, decompositions: dict):
        super().__init__()
        _defer_dynamo_imports()
        self.graph = torch.fx.Graph()
        self.decompositions = decompositions
        self.constants: dict[str, torch.Tensor] = {}
        self._constant_standins: dict[int, Standin] = {}  # id(real tensor) -> its stand-in

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No `torch._disable_dynamo` around __torch_dispatch__: it imports torch._dynamo on the
        first op, which is what this tracer is for avoiding (Dynamo never traces a trace here)."""
        return False

    def placeholder(self, slot: int, value: torch.Tensor) -> Standin:
        node = self.graph.placeholder(f"arg{slot}_1")
        standin = Standin(_meta_like(value), value.device, node, slot, is_view=False)
        node.meta["val"] = standin
        return standin

    def _constant(self, value: torch.Tensor) -> Standin:
        """A real tensor the function closes over, as a constant of the graph (make_fx's `_tensor_constant`)."""
        standin = self._constant_standins.get(id(value))
        if standin is None:
            name = f"_tensor_constant{len(self.constants)}"
            self.constants[name] = value
            node = self.graph.get_attr(name)
            standin = Standin(_meta_like(value), value.device, node, CONSTANT, is_view=False)
            node.meta["val"] = standin
            self._constant_standins[id(value)] = standin
        return standin

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(tag in func.tags for tag in _READS_VALUES) and not _indexes_by_integers(func, args):
            raise Untraceable(f"{func} reads tensor values or draws random numbers")
        if func in self.decompositions:
            with self:
                out = self.decompositions[func](*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _decomposes_in_autograd(func, args, kwargs):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func is aten.alias.default and isinstance(args[0], Standin) and args[0].node.graph is self.graph:
            # decompositions turn `detach` and `lift_fresh` into alias; with no writes into views it
            # is the same value, so the graph gets no node for it (make_fx's functionalization drops it)
            base = args[0]
            base.aliased = True
            return Standin(aten.alias.default(base.meta), base.device, base.node, base.root, is_view=True)
        if func is aten.lift_fresh.default:  # make_fx's rule: the lifted constant must not alias the graph's
            func = aten.lift_fresh_copy.default
        return self._record(func, args, kwargs)

    def _record(self, func, args, kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        flat = [self._constant(v) if isinstance(v, torch.Tensor) and not isinstance(v, Standin) else v for v in flat]
        standins = [v for v in flat if isinstance(v, Standin)]
        if any(s.node.graph is not self.graph for s in standins):
            raise Untraceable("a tensor of an earlier trace (kept by the function) reached this one")
        written = _written_argument(func, args, kwargs)
        if written is not None:
            target = written if isinstance(written, Standin) else None
            if target is None or target.root is not None or target.is_view or target.aliased or target.node.users:
                raise Untraceable(f"{func} writes into an argument, a constant, a view or a value already read")
        device = _result_device(func, standins, kwargs)
        meta_flat = [v.meta if isinstance(v, Standin) else v for v in flat]
        meta_args, meta_kwargs = pytree.tree_unflatten(meta_flat, spec)
        if _has_device_argument(func):
            meta_kwargs = {**meta_kwargs, "device": torch.device("meta")}
        try:
            out = func(*meta_args, **meta_kwargs)
        except Exception as err:  # noqa: BLE001 - no meta kernel, or eager's own error: make_fx says which
            raise Untraceable(f"{func} did not run on meta tensors ({type(err).__name__}: {err})") from None
        node_flat = [v.node if isinstance(v, Standin) else v for v in flat]
        node_args, node_kwargs = pytree.tree_unflatten(node_flat, spec)
        node = self.graph.create_node(
            "call_function",
            func,
            tuple(node_args),
            node_kwargs,
            name=self.graph._target_to_str(func.overloadpacket.__name__),
        )
        if written is not None:  # the in-place op's result is its first argument, now computed by this node
            if (written.meta.shape, written.meta.stride()) != (written.shape, written.stride()):
                raise Untraceable(f"{func} changed the shape or strides of a tensor in place")
            written.node = node
            node.meta["val"] = written
            return written
        return self._wrap(func, out, node, device, args)

    def _wrap(self, func, out, node, device, args):
        """Stand-ins for the op's results (getitem nodes for each tensor of a tuple or list)."""
        returns = func._schema.returns
        if isinstance(out, torch.Tensor):
            standin = self._standin(out, device, node, returns[0] if returns else None, args)
            node.meta["val"] = standin
            return standin
        if not isinstance(out, (tuple, list)):
            raise Untraceable(f"{func} returned {type(out).__name__}")
        results = []
        for i, value in enumerate(out):
            if value is None:
                results.append(None)
                continue
            if not isinstance(value, torch.Tensor):
                raise Untraceable(f"{func} returned a {type(value).__name__}")
            item = self.graph.create_node("call_function", operator.getitem, (node, i), {}, name="getitem")
            schema_return = returns[i] if len(returns) == len(out) else (returns[0] if returns else None)
            standin = self._standin(value, device, item, schema_return, args)
            item.meta["val"] = standin
            results.append(standin)
        node.meta["val"] = tuple(results)
        return type(out)(results)

    @staticmethod
    def _standin(meta, device, node, schema_return, args) -> Standin:
        if meta.device.type != "meta":
            raise Untraceable(f"{node.target} made a tensor on {meta.device}")
        alias = schema_return.alias_info if schema_return is not None else None
        if alias is None:
            return Standin(meta, device, node, None, is_view=False)
        base = next((a for a in args if isinstance(a, Standin)), None)
        if base is None:
            raise Untraceable(f"{node.target} returns a view of a value it did not get as its first argument")
        return Standin(meta, device, node, base.root, is_view=True)


def _indexes_by_integers(func, args) -> bool:
    """`x[idx]` with integer index tensors: its result's shape is the indices' (a boolean mask's
    would be its count of True, read from values)."""
    if func is not aten.index.Tensor or len(args) < 2:
        return False
    return all(
        i is None
        or (isinstance(i, torch.Tensor) and not i.dtype.is_floating_point and i.dtype not in (torch.bool, torch.uint8))
        for i in args[1]
    )


def _written_argument(func, args, kwargs):
    """The argument an op writes into (its `self`, for an in-place op); Untraceable for any other
    write (an `out=` argument, a second written argument); None for a pure op."""
    schema = func._schema
    if not schema.is_mutable:
        return None
    if torch.Tag.inplace_view in func.tags:  # `t.unsqueeze_(0)`: a stand-in's shape is fixed
        raise Untraceable(f"{func} changes a tensor's shape in place")
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    first = schema.arguments[0] if schema.arguments else None
    if len(written) != 1 or written[0] is not first or first.kwarg_only or not args:
        raise Untraceable(f"{func} writes into an argument other than its first")
    return args[0]


def _has_device_argument(func) -> bool:
    """Whether the op takes `device=` (keyword-only in ATen's factories and `_to_copy`)."""
    for argument in func._schema.arguments:
        if argument.name == "device":
            if not argument.kwarg_only:
                raise Untraceable(f"{func} takes its device positionally")
            return True
    return False


def _result_device(func, standins: list[Standin], kwargs) -> torch.device:
    """The device of an op's results: its `device=` if given, else that of its tensor arguments
    (a 0-dim CPU tensor goes with any, as in eager), else the default device (a factory)."""
    if _has_device_argument(func) and kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    devices = {s.device for s in standins if not (s.device.type == "cpu" and s.dim() == 0)}
    if len(devices) > 1:
        raise Untraceable(f"{func} got tensors on {sorted(map(str, devices))}")
    if devices:
        return devices.pop()
    if standins:
        return standins[0].device
    return torch.get_default_device()


def _decomposes_in_autograd(func, args, kwargs) -> bool:
    """A CompositeImplicitAutograd op that autograd would have split (make_fx applies the same
    rule: with no backend kernel for the first tensor's device)."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return False
    first = next((v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)), None)
    if first is None:
        return True
    backend = torch._C._parse_dispatch_key(torch._C._dispatch_key_for_device(first.device.type))
    return backend is None or not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), backend)


def can_try() -> bool:
    """Whether this call may be traced here: no autocast, user modes, functorch transforms or
    inference mode (a call that needs grad never gets here: autograd.py traces it)."""
    state = guards.global_state()
    return state[4] is None and state[5] is None and not torch.is_inference_mode_enabled()


def trace(flat_fn, tensors: list[torch.Tensor], slots: list[int], decompositions: dict) -> torch.fx.GraphModule:
    """`flat_fn(*tensors)` (which returns the list of tensors the graph computes) as an ATen
    graph, like make_fx's; Untraceable if anything in it needs make_fx."""
    recorder = Recorder(decompositions)
    standins = [recorder.placeholder(slot, t) for slot, t in zip(slots, tensors)]
    with torch.no_grad(), recorder:
        computed = flat_fn(*standins)
    outputs = []
    for value in computed:
        if not isinstance(value, Standin):
            raise Untraceable(f"the function returns a {type(value).__name__} it did not compute from its inputs")
        outputs.append(value.node)
    recorder.graph.output(outputs)
    return torch.fx.GraphModule(recorder.constants, recorder.graph)
