"""In-place buffer reuse: a kernel writes a store into the memory of a buffer it reads for the
last time, as Inductor's in-place buffer reuse does; and a mutated input's new value into the
input itself (`written_in_place`; an ATen op's or a scatter's that starts as the input:
`extern_written_in_place`, `scatter_written_in_place`)."""

from __future__ import annotations

import torch

from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.pointwise import PointwiseSource
from minicomp.codegen.reduction import ReductionSource
from minicomp.ir import TensorMeta
from minicomp.lowering.layout import extent, is_dense
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.scatters import scatter_of
from minicomp.plan.fusion import Plan
from minicomp.plan.storages import Storages
from minicomp.plan.storages import uses as step_uses


def reused_in_place(plan: Plan, storages: Storages, source: KernelSource, dying: list[str]) -> dict[str, str]:
    """Store -> a buffer the kernel reads for the last time whose memory it can write it into:
    the kernel's own intermediate (not an output or view of something; an input only where the
    caller donated it, `plan.donated`: a backward's saved logits take their gradient; a result of
    the call only there and where `plan.results_over_donated`: a gradient made in the forward,
    scaled over itself), dense, of
    the store's dtype and large enough, and read only at the store's own address, so each element
    is read by the program that overwrites it, before it does (any shape: the addresses are what
    match). A backward's gradient of the MLP's hidden state goes into the matmul result it came
    from. A pointwise kernel reads at its stores' addresses (`PointwiseSource.aligned`), and a
    reduction at its row stores' and its last pass's one element store's (`ReductionSource.aligned`)."""
    if not isinstance(source, (PointwiseSource, ReductionSource)):
        return {}
    graph, reused, taken = plan.graph, {}, set()
    returned = set()
    if plan.results_over_donated:
        returned = {o for o in graph.outputs if isinstance(o, str)} - {n for pair in graph.mutations for n in pair}
    for name in source.kernel.stores:
        meta = graph[name].meta
        if name in storages.kept and name not in returned:
            continue
        if name in plan.interior:  # inside a padded buffer: that buffer over a donated one's memory
            buffer = _padded_host(plan, source, name, dying, taken)
            if buffer:
                reused[name] = buffer
                taken.add(buffer)
            continue
        for buffer in source.aligned.get(name, ()):
            other = graph[buffer].meta
            if name in storages.kept and buffer not in plan.donated:  # a result: only into a donated input
                continue
            if (
                buffer in dying
                and buffer not in taken
                and storages.owns_memory(buffer)
                and buffer not in (storages.inputs - plan.donated) | storages.kept
                and isinstance(other, TensorMeta)
                and (other.dtype, other.device) == (meta.dtype, meta.device)
                and other.stride == plan.strides.get(buffer, other.stride)
                and is_dense(other.shape, other.stride)  # it is all its memory
                and extent(meta.shape, plan.strides[name]) <= other.numel
            ):
                reused[name] = buffer
                taken.add(buffer)
                break
    return reused


def _padded_host(plan: Plan, source: KernelSource, name: str, dying: list[str], taken: set) -> str | None:
    """A donated input the kernel reads for the last time, only at `name`'s addresses, laid out as
    `name` is inside its padded buffer (BERT's saved logits, a row-padded product's slice, take
    their gradient written inside the padded buffer for the gradient's matmuls): the padded buffer
    is then made over its memory, where that memory is large enough (the wrapper checks, at run
    time: `runtime/allocate.py` `over_or_empty`)."""
    meta = plan.graph[name].meta
    for buffer in source.aligned.get(name, ()):
        other = plan.graph[buffer].meta
        if (
            buffer in dying
            and buffer in plan.donated
            and buffer not in taken
            and isinstance(other, TensorMeta)
            and (other.shape, other.dtype, other.device) == (meta.shape, meta.dtype, meta.device)
            and tuple(other.stride) == tuple(plan.strides[name])
        ):
            return buffer
    return None


def written_in_place(plan: Plan, storages: Storages, source: KernelSource, at: int) -> dict[str, str]:
    """Store -> the mutated input it is the new value of (`graph.mutations`), where the kernel can
    write it there instead of into new memory copied back at the end (batch norm's running
    statistics: a step of ResNet-50 made 267 such copies): the input laid out as the store, dense
    (no element twice), of its dtype; the store no graph output's memory; the input read by this
    kernel only at the store's own address (`aligned`: a pointwise kernel's, a reduction's row
    stores; a pointwise kernel of one element: `num_batches_tracked + 1`) and by no later step,
    nor through a view (its old value is gone once written)."""
    aligned = getattr(source, "aligned", None) or {}
    graph, kernel, written = plan.graph, source.kernel, {}
    if not graph.mutations:
        return written
    outputs = {storages.owner.get(o) for o in graph.outputs if isinstance(o, str)}
    for dst, src in graph.mutations:
        if src not in kernel.stores or src in written or src in outputs or not storages.owns_memory(src):
            continue
        meta, other = graph[src].meta, graph[dst].meta
        if not (
            isinstance(other, TensorMeta)
            and (other.shape, other.dtype, other.device) == (meta.shape, meta.dtype, meta.device)
            and other.stride == plan.strides[src]
            and is_dense(other.shape, other.stride)
        ):
            continue
        reach = _views_of(plan, storages, dst)
        single = isinstance(source, PointwiseSource) and source.numel == 1  # one lane reads, then writes
        if set(kernel.loads) & (reach - ({dst} if single or dst in aligned.get(src, ()) else set())):
            continue
        if any(reach & set(step_uses(plan, step)) for step in plan.steps[at + 1 :]):
            continue
        if any(storages.owner.get(s) in reach or s in reach for d, s in graph.mutations if d != dst):
            continue
        written[src] = dst
    return written


def extern_written_in_place(plan: Plan, storages: Storages, at: int):
    """(the in-place op, the mutated input) for extern step `at` whose result is that input's new
    value, where ATen's in-place form can write it there instead of into a copy of the input
    copied back at the end (a `index_copy_` into a cache ATen computes: functionalized to
    `index_put` and a `copy_`, two copies of the whole cache a call): an op `aten.X.ov` with an
    `aten.X_.ov`, whose first argument is the input itself (`_over_its_input`). Else None."""
    step = plan.steps[at]
    node = plan.graph[step.node]
    target, args = node.target, node.args
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten" or not args:
        return None
    in_place = getattr(getattr(torch.ops.aten, f"{target._opname}_", None), target._overloadname, None)
    dst = _over_its_input(plan, storages, at, node.name, getattr(args[0], "name", None), set(node.inputs()[1:]))
    if in_place is None or dst is None:
        return None
    return in_place, dst


def scatter_written_in_place(plan: Plan, storages: Storages, at: int, reads: set[str]) -> str | None:
    """The mutated input scatter step `at` writes its result into, where that result is the
    input's new value and starts as the input (`self`): a static KV cache's update, a token's keys
    stored at its position, where the output would else start as a copy of the whole cache, copied
    back at the end (`_over_its_input`; `reads`: the buffers its kernel loads). Else None."""
    name = plan.steps[at].stores[0]
    base = scatter_of(plan.graph[name], plan.graph).base
    return _over_its_input(plan, storages, at, name, base, reads)


def _over_its_input(plan: Plan, storages: Storages, at: int, name: str, base: str | None, reads: set[str]):
    """The mutated input step `at` may write value `name` (its new value, computed from `base`, its
    old one) into: `base` is the input itself, laid out as `name` (dense); `name` is no graph
    output; nothing that reaches the input's memory is read by the step otherwise (`reads`), by a
    later step, returned, or written by another mutation. Else None."""
    graph = plan.graph
    dst = next((d for d, s in graph.mutations if s == name), None)
    if dst is None or base != dst or not storages.owns_memory(name):
        return None
    meta, other = graph[name].meta, graph[dst].meta
    if not (
        isinstance(meta, TensorMeta)
        and isinstance(other, TensorMeta)
        and (other.shape, other.dtype, other.device) == (meta.shape, meta.dtype, meta.device)
        and tuple(other.stride) == tuple(plan.strides.get(name, meta.stride))
        and is_dense(other.shape, other.stride)
    ):
        return None
    reach = _views_of(plan, storages, dst)
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    if name in outputs or reach & outputs or reach & reads:
        return None
    if any(reach & set(step_uses(plan, later)) for later in plan.steps[at + 1 :]):
        return None
    if any(storages.owner.get(s) in reach or s in reach for d, s in graph.mutations if d != dst):
        return None
    return dst


def _views_of(plan: Plan, storages: Storages, name: str) -> set[str]:
    """`name` and every value that reaches its memory: extern views, and views kernels inline."""
    reach = {name} | {v for v, o in storages.owner.items() if o == name}
    stack = list(reach)
    while stack:
        for user in plan.graph.users(stack.pop()):
            if user not in reach and plan.kinds.get(user) is NodeKind.VIEW:
                reach.add(user)
                stack.append(user)
    return reach
