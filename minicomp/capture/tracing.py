"""Capture: a Python function -> an ATen-level torch.fx GraphModule.

A trace runs first on meta stand-ins (meta_trace.py). What those refuse is traced
here with make_fx on fake tensors (no real compute), through functionalization (in-place ops become pure ops plus
`copy_` into the mutated input at the end). Both apply PyTorch's core ATen
decompositions (silu -> x * sigmoid(x), stack -> unsqueeze + cat, ...).
Tensors the function closes over (a global weight) become constants of the
trace, like Python scalars: their values are captured when the signature is
first compiled. What each leaf of the function's result is (a graph output, an
argument, a view of one, a constant) is recorded in an Outputs (outputs.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import sys
import threading
from pathlib import Path

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from minicomp import guards, logs
from minicomp.capture import meta_trace
from minicomp.capture.outputs import Argument, ArgumentView, Constant, GraphOutput, OutputRecord, Outputs, SameAs

# Ops that ATen's core set keeps whole but minicomp fuses from their parts (reductions and
# pointwise ops): softmax and log_softmax (amax, exp, sum), layer_norm and group_norm (mean and
# a two-pass variance), var/var_mean (a mean, then a sum of squared deviations, as eager), norms.
FUSED_FROM_PARTS = (
    "_softmax.default",
    "_log_softmax.default",
    "native_layer_norm.default",
    "native_group_norm.default",
    "linalg_vector_norm.default",
)


@functools.cache
def decompositions() -> dict:
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for name in FUSED_FROM_PARTS:
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet), overload)
        table[op] = decomposition_table[op]
    # The CPU flash attention's decomposition returns the attention weights where the op returns
    # its logsumexp, which its backward reads: gradients through SDPA on the CPU came out wrong.
    # It stays one ATen call (as SDPA on a GPU does).
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    # ATen's own var decompositions go to prims; these stay in the aten ops minicomp lowers
    table[aten.var.correction] = _var
    table[aten.var_mean.correction] = _var_mean
    return table


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """(var, mean) in two passes, as eager: the mean, then the mean square deviation from it,
    accumulated in float32 for 16-bit inputs."""
    dims = list(range(x.ndim)) if dim is None or len(dim) == 0 else [d % max(x.ndim, 1) for d in dim]
    count = 1
    for d in dims:
        count *= x.shape[d]
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    mean = wide.mean(dims, keepdim=True)
    deviation = wide - mean
    var = (deviation * deviation).sum(dims, keepdim=keepdim) / max(count - (1 if correction is None else correction), 0)
    mean = mean if keepdim else mean.squeeze(dims)
    return var.to(x.dtype), mean.to(x.dtype)


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def flatten_outputs(result) -> tuple[list, object]:
    """Leaves and structure of a traced function's result; a torch.Size is one leaf (not a tuple of
    ints). A number read from tensor values (a symbol of the trace) is refused."""
    leaves, spec = pytree.tree_flatten(result, is_leaf=lambda v: isinstance(v, torch.Size))
    guards.refuse_numbers_from_values(leaves)
    return leaves, spec


class ClosedOver(TorchFunctionMode):
    """While a function is traced, the real tensors it hands to torch: what it closes over (a
    global weight, a module it names, a RoPE table), as opposed to the traced inputs (fake or
    functional tensors) and what it computes from them. A graph holds them as constants, so
    one that requires grad would lose its gradient (guards.refuse_grad_constants). A call that
    hooks into autograd (`retain_grad`, `register_hook`) is refused while tracing: a graph keeps
    the values, not the hooks."""

    def __init__(self):
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}
        self.grad_turned_on = False  # an op ran with grad mode on where the call had it off (enable_grad)
        self._grad_at_call = torch.is_grad_enabled()
        self.stopped: Exception | None = None  # why the trace stopped (guards.TraceStopped), if it did

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self._grad_at_call and torch.is_grad_enabled():
            self.grad_turned_on = True
        if func in _GRAD_HOOKS:
            raise guards.GradHook(
                f"it calls Tensor.{func.__name__}, which a compiled graph cannot keep: the hook (or the "
                "retained .grad) would never see the compiled backward"
            )
        if func in _VALUE_READS:
            self.stopped = guards.ReadsValues(
                "it branches on tensor values (e.g. `if x.sum() > 0`), which a trace cannot follow. Use "
                "torch.where for the branch, decide it from shapes or Python arguments, or keep that part "
                "outside the jitted function"
                if func is torch.Tensor.__bool__
                else f"it reads tensor values in Python (Tensor.{func.__name__}: `int(t)`, `.item()`, "
                "`.tolist()`, `.numpy()`), which a trace has none of: keep that read outside the jitted function"
            )
            raise guards.TraceStopped(self.stopped)
        if _fails_on_values(func, args) and _inside_a_try():
            self.stopped = guards.ReadsValues(
                f"it indexes by tensor values ({getattr(func, '__name__', func)}) inside its own try block: "
                "eager raises for an index out of range and takes the except branch, compiled code cannot"
            )
            raise guards.TraceStopped(self.stopped)
        kwargs = kwargs or {}
        written = _written_in_place(func, args, kwargs)
        if written is not None and _is_real(written):
            raise guards.SideEffect(
                f"it writes in place into a tensor it closes over (shape {list(written.shape)}, by "
                f"{getattr(func, '__name__', func)}), which compiled code would not repeat: pass that tensor "
                "as an argument, or keep the write outside the jitted function"
            )
        for value in pytree.tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and _is_real(value):
                self.tensors.setdefault(id(value), value)
        try:
            return func(*args, **kwargs)
        except Exception as err:
            if not any(k.__name__ in _TRACER_ERRORS for k in type(err).__mro__):
                raise  # eager's own error (a shape mismatch): the function may catch it, as in eager
            self.stopped = err
            raise guards.TraceStopped(err) from err

    @contextlib.contextmanager
    def refusing(self):
        """Around the call of the traced function, outside its frames: a TraceStopped becomes its
        refusal, and a refusal the function swallowed (a bare `except:`) is raised all the same."""
        try:
            yield
        except guards.TraceStopped as stop:
            raise stop.refusal from None
        if self.stopped is not None:
            raise self.stopped


# Tensor methods that read values into Python: a stand-in has none (`.numpy()` would read memory
# that holds none), and a number read would be baked into the trace
_VALUE_READS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__array__,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__complex__,
        torch.Tensor.__index__,
    }
)
# ops that raise for some values of their tensor arguments (an index out of range)
_INDEXING = frozenset(
    "__getitem__ __setitem__ index_select gather take take_along_dim embedding one_hot index_add index_add_ "
    "index_copy index_copy_ index_fill index_fill_ index_put index_put_ scatter scatter_ scatter_add "
    "scatter_add_ scatter_reduce scatter_reduce_".split()
)


def _fails_on_values(func, args) -> bool:
    """An op that indexes by tensor values (`x[idx]`, gather, embedding): eager may raise for them."""
    if getattr(func, "__name__", "") not in _INDEXING:
        return False
    if func.__name__ in ("__getitem__", "__setitem__"):
        index = args[1] if len(args) > 1 else None
        return any(
            isinstance(i, torch.Tensor) and i.dtype != torch.bool and not i.is_floating_point()
            for i in pytree.tree_leaves(index)
        )
    return True


_PACKAGES = tuple(os.path.join(path, "") for path in (Path(torch.__file__).parent, Path(__file__).parents[1]))


def _inside_a_try() -> bool:
    """Whether the user's code calling torch now runs inside a try block of its own (one with an
    except or finally: a `with` block's cleanup does not count), in any of its frames."""
    frame, users = sys._getframe(2), False
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_PACKAGES):
            if users and filename.startswith(_PACKAGES[1]):
                return False  # past the user's frames: the tracer's own
        else:
            users = True
            if _catches(frame.f_code, frame.f_lasti):
                return True
        frame = frame.f_back
    return False


@functools.cache
def _catches(code, lasti: int) -> bool:
    import dis

    parse = getattr(dis, "_parse_exception_table", None)  # (CPython 3.11+; before, no table to read)
    for entry in parse(code) if parse is not None else ():
        if entry.start <= lasti < entry.end:
            ops = code.co_code
            with_block = entry.target + 2 < len(ops) and ops[entry.target + 2] == dis.opmap["WITH_EXCEPT_START"]
            return ops[entry.target] == dis.opmap["PUSH_EXC_INFO"] and not with_block
    return False


# what the tracers raise where only tensor values (or make_fx) could go on; by name, so that
# checking imports no fake tensors
_TRACER_ERRORS = frozenset(
    {
        "Untraceable",
        "DataDependentOutputException",
        "DynamicOutputShapeException",
        "UnsupportedOperatorException",
        "GuardOnDataDependentSymNode",
    }
)


_IN_PLACE_OPERATORS = {
    f"__i{op}__" for op in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift".split()
}


def _written_in_place(func, args, kwargs) -> torch.Tensor | None:
    """The tensor a call of torch's writes into: its `out=`, or the first argument of an in-place
    op (`add_`, `x[i] = v`, `x += v`, `F.relu(x, inplace=True)`); None for an op that writes nothing."""
    out = kwargs.get("out")
    for value in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(value, torch.Tensor):
            return value
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_OPERATORS
    if in_place or name == "__setitem__" or kwargs.get("inplace") is True:
        return args[0]
    return None


def _refuse_grad_inside(needs_grad: list[torch.Tensor], closed_over: list[torch.Tensor]) -> None:
    """A function called with grad mode off turned it on (`torch.enable_grad()`) while it had a
    tensor that requires grad: eager's result would require grad, and an inference graph
    records no autograd. Such a signature runs eagerly."""
    if needs_grad or any(t.requires_grad for t in closed_over):
        raise guards.GradModeInside(
            "it turns grad mode on inside (torch.enable_grad / set_grad_enabled) while called under "
            "no_grad with a tensor that requires grad, whose result eager records for autograd"
        )


_GRAD_HOOKS = (
    torch.Tensor.retain_grad,
    torch.Tensor.register_hook,
    torch.Tensor.register_post_accumulate_grad_hook,
)


def _is_real(value: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return not isinstance(
        value, (FakeTensor, FunctionalTensor, meta_trace.Standin)
    ) and not torch._is_functional_tensor(value)


class Traced:
    """The graph of `fn` for one input signature, and how to map values in and out.

    leaves: the flattened arguments (tensors become graph inputs, everything
    else is a constant of the trace); `outputs` rebuilds the result.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        input_names: list[str],
        tensor_slots: list[int],
        outputs: Outputs,
        closed_over: list[torch.Tensor],
    ):
        self.gm = gm
        self.input_names = input_names
        self.tensor_slots = tensor_slots
        self.outputs = outputs
        self.closed_over = closed_over  # real tensors the function read (ClosedOver)


def trace(fn, leaves: list, in_spec, leaf_names: list[str]) -> Traced:
    """Trace fn(*tree_unflatten(leaves, in_spec)) with the tensor leaves as inputs.

    Only the tensors the function computes become graph outputs; what an output
    is besides (an argument, a view of one, a constant) is recorded in Outputs.
    meta_trace.py's tracer is tried first (a process's first trace then loads no
    torch._dynamo); what it cannot take is traced by make_fx."""
    tensor_slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    names = [leaf_names[i] for i in tensor_slots]
    if meta_trace.can_try():
        try:
            gm, outputs, closed_over = _trace_on_standins(fn, leaves, in_spec, tensor_slots)
        except (guards.SideEffect, guards.GradHook, guards.GradModeInside, guards.ReadsValues):  # refused by both
            raise
        except Exception as why:  # noqa: BLE001 - Untraceable, or an error make_fx reports its own way
            logs.graph.info("traced with make_fx: %s", why)
        else:
            return Traced(_functional_temporaries(gm), names, tensor_slots, outputs, closed_over)
    gm, outputs, closed_over = _trace_with_make_fx(fn, leaves, in_spec, tensor_slots)
    gm = _functional_temporaries(gm)
    if _writes_in_place(gm):
        gm = _functionalized(gm, [leaves[i] for i in tensor_slots])
    return Traced(gm, names, tensor_slots, outputs, closed_over)


def _flat(fn, leaves, in_spec, tensor_slots, records_of):
    """(flat_fn, result, seen): flat_fn(*tensors) calls fn with the tensors at their slots and
    returns the tensors it computed; `records_of(out_leaves, tensors)` gives each output leaf's
    record and those tensors. result["outputs"] then says how a call's result is put together,
    `seen` (ClosedOver) which real tensors it closed over."""
    seen, result = ClosedOver(), {}
    grad = torch.is_grad_enabled()  # the call's grad mode: both tracers run under no_grad
    needs_grad = [leaves[i] for i in tensor_slots if leaves[i].requires_grad]

    def flat_fn(*tensors):
        values = list(leaves)
        for slot, t in zip(tensor_slots, tensors):
            values[slot] = t
        args, kwargs = pytree.tree_unflatten(values, in_spec)
        with seen.refusing(), seen, torch.set_grad_enabled(grad):  # `is_grad_enabled()` reads as in eager
            returned = fn(*args, **kwargs)
        if seen.grad_turned_on:
            _refuse_grad_inside(needs_grad, list(seen.tensors.values()))
        out_leaves, spec = flatten_outputs(returned)
        records, computed = records_of(out_leaves, tensors)
        result["outputs"] = Outputs(spec, records)
        return computed

    return flat_fn, result, seen


def _trace_on_standins(fn, leaves, in_spec, tensor_slots):
    def records_of(out_leaves, standins):
        computed = []
        return [_standin_record(out, i, out_leaves, standins, computed) for i, out in enumerate(out_leaves)], computed

    flat_fn, result, seen = _flat(fn, leaves, in_spec, tensor_slots, records_of)
    gm = meta_trace.trace(flat_fn, [leaves[i] for i in tensor_slots], tensor_slots, decompositions())
    return gm, result["outputs"], list(seen.tensors.values())


def _standin_record(out, i, out_leaves, standins, computed) -> OutputRecord:
    """_record for a trace on stand-ins: their `root` says which argument a view is of."""
    if not isinstance(out, torch.Tensor):
        return Constant(out)
    for j in range(i):
        if out_leaves[j] is out:
            return SameAs(j)
    if not isinstance(out, meta_trace.Standin) or out.root == meta_trace.CONSTANT:
        raise meta_trace.Untraceable("it returns a tensor it closes over, or a view of one")
    for standin in standins:
        if out is standin:
            return Argument(out.root)
    if out.root is not None:
        base = standins[[s.root for s in standins].index(out.root)]
        return _view_record(out, base, out.root)
    computed.append(out)
    return GraphOutput(len(computed) - 1)


def _trace_with_make_fx(fn, leaves, in_spec, tensor_slots):
    def records_of(out_leaves, tensors):
        computed = []
        storages = [StorageWeakRef(t.untyped_storage()) for t in tensors]
        records = [
            _record(out, i, out_leaves, tensors, storages, tensor_slots, computed) for i, out in enumerate(out_leaves)
        ]
        return records, computed

    flat_fn, result, seen = _flat(fn, leaves, in_spec, tensor_slots, records_of)

    from torch.func import functionalize  # tracing's imports load on the first compile, not at import
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [leaves[i] for i in tensor_slots]
    with torch.no_grad(), _fake_tensor_errors_unlogged():
        gm = make_fx(
            functionalize(flat_fn, remove="mutations"),
            decomposition_table=decompositions(),
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*[t.detach() for t in tensors])
    return gm, result["outputs"], list(seen.tensors.values())


class _DropFakeTensorErrors(logging.Filter):
    """FakeTensorMode logs an op's error with its traceback at ERROR level before raising it (31
    lines for `bool - bool`): the error itself reaches the caller (eager's, when the call falls
    back), so this thread's records of it are dropped while minicomp traces."""

    def __init__(self):
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.thread == self.thread and str(record.msg).startswith("failed while attempting to run meta"))


@contextlib.contextmanager
def _fake_tensor_errors_unlogged():
    logger, dropped = logging.getLogger("torch._subclasses.fake_tensor"), _DropFakeTensorErrors()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def _functional_temporaries(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`t.add_(eps)` on a temporary nothing else reads becomes `add(t, eps)`: decompositions
    (rms_norm's) write in place on values they just made, which functionalization never sees."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        packet = target._opname
        if not packet.endswith("_") or packet.startswith("_") or not node.args:
            continue
        first = node.args[0]
        if not isinstance(first, torch.fx.Node) or not _fresh(first) or len(first.users) != 1:
            continue  # a view's write lands in its base (circular pad's copy_ into slices of an empty)
        functional = getattr(getattr(torch.ops.aten, packet[:-1], None), target._overloadname, None)
        if functional is not None:
            node.target = functional
    gm.recompile()
    return gm


def _fresh(node: torch.fx.Node) -> bool:
    """Whether an op node's result is memory of its own: not a view of another value, nor the
    result of an in-place op (which is its first argument)."""
    if node.op != "call_function":
        return False
    target, index = node.target, 0
    if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):  # one result of a tuple
        target, index = node.args[0].target, node.args[1]
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    if not returns or isinstance(index, int) and index >= len(returns):
        return len(returns) == 1 and returns[0].alias_info is None  # a Tensor[] result
    return returns[index].alias_info is None


def _writes_in_place(gm: torch.fx.GraphModule) -> bool:
    """Whether an op of the graph still writes in place, besides the final `copy_` of a mutated
    input into it: a decomposition that writes into a view of a value it made (circular pad
    fills slices of an `empty`), which make_fx's decompositions run below functionalization."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if not node.target._schema.is_mutable:
            continue
        first = node.args[0] if node.args else None
        if (
            node.target is torch.ops.aten.copy_.default
            and isinstance(first, torch.fx.Node)
            and first.op == "placeholder"
        ):
            continue
        return True
    return False


def _functionalized(gm: torch.fx.GraphModule, tensors: list[torch.Tensor]) -> torch.fx.GraphModule:
    """`gm` traced once more through functionalization: a write into a view of a temporary becomes
    a pure op (slice_scatter, ...) whose value later reads see; a mutated input keeps its final
    `copy_`."""
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        traced = make_fx(
            functionalize(gm, remove="mutations"),
            decomposition_table=decompositions(),
            tracing_mode="fake",
            _allow_non_fake_inputs=True,
        )(*[t.detach() for t in tensors])
    return _functional_temporaries(traced)


def _record(out, i, out_leaves, tensors, storages, tensor_slots, computed) -> OutputRecord:
    """What output leaf `i` is (capture/outputs.py); a tensor the function computed is added to
    `computed`, the graph's outputs."""
    if not isinstance(out, torch.Tensor):
        return Constant(out)
    for j in range(i):
        if out_leaves[j] is out:
            return SameAs(j)
    for k, t in enumerate(tensors):
        if out is t:
            return Argument(tensor_slots[k])
    storage = StorageWeakRef(out.untyped_storage())
    for k, t in enumerate(tensors):
        if storage == storages[k]:
            return _view_record(out, t, tensor_slots[k])
    computed.append(out)
    return GraphOutput(len(computed) - 1)


def _view_record(out: torch.Tensor, base: torch.Tensor, slot: int) -> ArgumentView:
    """`out`, a view of argument `base`; one of another dtype (`x.view(torch.int32)`) is put back as
    a view of `base.view(out.dtype)` (counted in its elements), or, where that view does not exist
    for every call of the signature, refused."""
    if out.dtype == base.dtype:
        offset = out.storage_offset() - base.storage_offset()
        return ArgumentView(slot, tuple(out.shape), tuple(out.stride()), offset)
    try:
        as_dtype = base.view(out.dtype)
    except RuntimeError:
        raise meta_trace.Untraceable("it returns a view of an argument as a dtype of another size") from None
    offset = out.storage_offset() - as_dtype.storage_offset()
    return ArgumentView(slot, tuple(out.shape), tuple(out.stride()), offset, out.dtype)


def call_eagerly(fn, leaves, in_spec):
    """fn called as written with the flattened arguments (`in_spec` an int: the positional fast path)."""
    if isinstance(in_spec, int):
        return fn(*leaves)
    args, kwargs = pytree.tree_unflatten(list(leaves), in_spec)
    return fn(*args, **kwargs)


def leaf_names(in_spec, params: list[str]) -> list[str]:
    """Readable names for the flattened (args, kwargs): x, b, inputs_0, scale, ..."""
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * in_spec.num_leaves, in_spec))
    names = []
    for path, _ in paths:
        (group, first), rest = path[:2], path[2:]
        head = params[first.idx] if group.idx == 0 and first.idx < len(params) else str(getattr(first, "key", "arg"))
        names.append("_".join([head] + [str(getattr(k, "key", getattr(k, "idx", k))) for k in rest]))
    return names
