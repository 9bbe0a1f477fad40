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
import threading

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from minicomp import guards, logs
from minicomp.capture import max_pool, meta_trace
from minicomp.capture.closed_over import ClosedOver, refuse_grad_inside
from minicomp.capture.functional import functional_temporaries, functionalized, writes_in_place
from minicomp.capture.outputs import (
    Argument,
    ArgumentView,
    Constant,
    ConstantView,
    GraphOutput,
    OutputRecord,
    Outputs,
    OutputView,
    SameAs,
    view_fields,
)

# Ops that ATen's core set keeps whole but minicomp fuses from their parts (reductions and
# pointwise ops): softmax and log_softmax (amax, exp, sum), layer_norm and group_norm (mean and
# a two-pass variance), var/var_mean (a mean, then a sum of squared deviations, as eager), norms.
FUSED_FROM_PARTS = (
    "_softmax.default",
    "_log_softmax.default",
    "native_layer_norm.default",
    "native_group_norm.default",
    "linalg_vector_norm.default",
    # batch norm in every form AOTAutograd, functionalization or eager's dispatch leaves (the
    # running statistics' update a pointwise op of the statistics), and its backward's other forms
    "native_batch_norm.default",
    "_native_batch_norm_legit.default",
    "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_functional.default",
    "_native_batch_norm_legit_no_training.default",
    "_batch_norm_with_update.default",
    "_batch_norm_with_update_functional.default",
    "_batch_norm_no_update.default",
    "batch_norm_backward.default",
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
    # max pooling's positions kept as one byte a window (max_pool.py)
    table[aten.max_pool2d_with_indices.default] = max_pool.max_pool2d_with_indices
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
        except guards.TRACE_REFUSALS:  # refused by both tracers
            raise
        except Exception as why:  # noqa: BLE001 - Untraceable, or an error make_fx reports its own way
            logs.graph.info("traced with make_fx: %s", why)
        else:
            return Traced(
                _without_dead_allocations(functional_temporaries(gm)), names, tensor_slots, outputs, closed_over
            )
    gm, outputs, closed_over = _trace_with_make_fx(fn, leaves, in_spec, tensor_slots)
    gm = functional_temporaries(gm)
    if writes_in_place(gm):
        gm = functionalized(gm, [leaves[i] for i in tensor_slots], decompositions())
    return Traced(_without_dead_allocations(gm), names, tensor_slots, outputs, closed_over)


def _without_dead_allocations(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` without the tensors it makes from nothing and never reads (the reserve buffer that
    `_batch_norm_with_update`'s decomposition returns): each would be an ATen call in the module.
    Random draws stay (they advance the generator, as eager's do)."""
    dead = [
        node
        for node in gm.graph.nodes
        if node.op == "call_function"
        and not node.users
        and isinstance(node.target, torch._ops.OpOverload)
        and not node.target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in node.target.tags
        and not any(isinstance(a, torch.fx.Node) for a in pytree.tree_leaves((node.args, node.kwargs)))
    ]
    for node in dead:
        gm.graph.erase_node(node)
    if dead:
        gm.recompile()
    return gm


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
            refuse_grad_inside(needs_grad, list(seen.tensors.values()))
        out_leaves, spec = flatten_outputs(returned)
        records, computed = records_of(out_leaves, tensors, seen)
        result["outputs"] = Outputs(spec, records)
        return computed

    return flat_fn, result, seen


def _trace_on_standins(fn, leaves, in_spec, tensor_slots):
    def records_of(out_leaves, standins, seen):
        computed = []
        records = [_standin_record(out, i, out_leaves, standins, computed) for i, out in enumerate(out_leaves)]
        return _views_of_outputs(records, out_leaves, lambda t: (t.is_view, t.meta.untyped_storage())), computed

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
    def records_of(out_leaves, tensors, seen):
        computed = []
        storages = [StorageWeakRef(t.untyped_storage()) for t in tensors]
        records = [
            _record(out, i, out_leaves, tensors, storages, tensor_slots, computed, seen)
            for i, out in enumerate(out_leaves)
        ]
        records = _views_of_outputs(records, out_leaves, lambda t: (t._is_view(), t.untyped_storage()))
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


def _record(out, i, out_leaves, tensors, storages, tensor_slots, computed, seen) -> OutputRecord:
    """What output leaf `i` is (capture/outputs.py); a tensor the function computed is added to
    `computed`, the graph's outputs. A view of a tensor the function closes over (`seen`) comes
    back as that view of it, as in eager (a graph output would be a copy)."""
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
    base = seen.constant_base(out)
    if base is not None:
        return _view_record(out, base, None)
    computed.append(out)
    return GraphOutput(len(computed) - 1)


def _views_of_outputs(records: list, out_leaves: list, view_and_storage) -> list:
    """`records` with each graph output that views an earlier graph output (`return y, y[1:]`)
    as an OutputView of it, as eager returns them (a graph output is memory of its own).
    `view_and_storage(t)`: whether traced tensor t is a view, and its storage."""
    found = list(records)
    for i, record in enumerate(records):
        out = out_leaves[i]
        if type(record) is not GraphOutput or not view_and_storage(out)[0]:
            continue
        storage = StorageWeakRef(view_and_storage(out)[1])
        for j in range(i):
            base = out_leaves[j]
            if type(records[j]) is GraphOutput and StorageWeakRef(view_and_storage(base)[1]) == storage:
                # (a view(dtype) counts its offset in its own elements)
                start, left = divmod(base.storage_offset() * base.dtype.itemsize, out.dtype.itemsize)
                if left == 0:
                    dtype = None if base.dtype == out.dtype else out.dtype
                    found[i] = OutputView(j, record.index, tuple(out.shape), tuple(out.stride()),
                                          out.storage_offset() - start, tuple(base.shape), tuple(base.stride()),
                                          dtype)  # fmt: skip
                break
    return found


def _view_record(out: torch.Tensor, base: torch.Tensor, slot: int | None) -> ArgumentView | ConstantView:
    """`out`, a view of argument `base` (at leaf `slot`), or with `slot` None of `base`, a tensor the
    function closes over; one of another dtype (`x.view(torch.int32)`) is put back as a view of
    `base.view(out.dtype)` (counted in its elements), or, where that view does not exist for every
    call of the signature, refused."""
    try:
        shape, stride, offset, dtype = view_fields(out, base)
    except ValueError:
        raise meta_trace.Untraceable("it returns a view of an argument as a dtype of another size") from None
    if slot is None:
        return ConstantView(base, shape, stride, offset, dtype)
    return ArgumentView(slot, shape, stride, offset, dtype)


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


def _constant_view(out, seen: ClosedOver) -> ConstantView | None:
    """The record of `out` where it is a view of a tensor the function closes over (a dtype view
    that tensor has no view of for every call aside: that one stays a graph output, a copy)."""
    base = seen.constant_base(out) if isinstance(out, torch.Tensor) else None
    try:
        return None if base is None else _view_record(out, base, None)
    except meta_trace.Untraceable:
        return None


def training_outputs(result, seen: ClosedOver) -> tuple[Outputs, list[torch.Tensor]]:
    """The Outputs of a traced training function's `result`, and the tensors its graph returns:
    AOTAutograd handles tensors (and their aliasing), so each is a graph output, but for a view
    of a tensor the function closes over (`seen`), which comes back as that view of it; the rest
    are constants."""
    out_leaves, spec = flatten_outputs(result)
    records, computed = [], []
    for out in out_leaves:
        view = _constant_view(out, seen)
        if view is not None:
            records.append(view)
        elif isinstance(out, torch.Tensor):
            computed.append(out)
            records.append(GraphOutput(len(computed) - 1))
        else:
            records.append(Constant(out))
    return Outputs(spec, records), computed
