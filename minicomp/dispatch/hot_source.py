"""A hot path written out as Python for its signature (dispatch/hot_path.py).

The hot path's checks are few, but done by generic code they loop over lists of slots and call
through a layer per step; a graphed signature's replay adds three more layers
(runtime/graphs.py `replay_recorded`, `Record.replay`, graph_outputs.py `ready` / `hand_out`). So
each signature's hot path is one function: its checks unrolled over its arguments, its record's
replay inline, the record's values (addresses, output metadata) in its namespace, so a hot path made
again for its entry (a Parameter's, then a tensor's) reuses the code it compiled. For `f(x, y)`
graphed, one output in the graph's memory (`minicomp.jit(f)._hot.source`):

    def hot_f(args, context_state):
        if len(args) != 2 or global_state() != modes:
            return MISS
        a0, a1 = args
        try:
            if a0.is_nested or a1.is_nested:  # (torch's C++ tensor guards abort on one)
                return MISS
        except AttributeError:  # (not a tensor where one was)
            return MISS
        if not check(a0, a1):
            return MISS
        if context_state is not None and context_state() != context:
            return MISS
        record = record_ref()
        if record is None or records.get(()) is not record:
            return MISS
        if (
            a0.data_ptr() != ptr_0 or
            a1.data_ptr() != ptr_1
        ):
            return MISS
        graphed.misses = 0
        record.used = next(clock)
        handed = record.handed
        s0, = handed if len(handed) == 1 else (None,)
        if s0 is None or use_count(s0._cdata) > 1 or s0.data_ptr() != memory_0:
            s0, = record.handed = plan.ready(handed)
        record.launch()
        return finish([on_0(s0)])

Each line is what the generic code did for this signature: `check` is torch's C++ TensorGuards,
`plan.ready` settles what a caller still holds of the last call's outputs (graph_outputs.py), and
`on_0` makes the output over the storage (one C++ call on a GPU). A plan that copies its outputs
(a torch that cannot move a held output: a backward's gradients, or any output where it cannot
mark one stale either) replays through `Graphed.replay_recorded`. An
H200's graphed `(x + y).relu()` went 9.7-11.0 -> 7.4-8.2 µs of host time (docs/experiments.md).
"""

from __future__ import annotations

import types

import torch

from minicomp import guards
from minicomp.runtime.graph_inputs import copy_inputs

MISS = object()  # a call the hot path does not serve
_MANY_ADDRESSES = 4  # more inputs read in place than this: their addresses compared in one C++ call
_same_ptrs = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds


def written(hot, name, earlier=None) -> tuple:
    """(the hot path's function, its source, its code) for `hot` (a HotPath). `earlier`: a hot path
    of the same entry made before; its code serves where the source is the same (the addresses and
    the like are names in the namespace, so a hot path made again, a Parameter's then a tensor's,
    compiles nothing)."""
    namespace = {
        "MISS": MISS,
        "global_state": guards.global_state,
        "leaf_key": guards.leaf_key,
        "modes": hot.modes,
        "context": hot.context,
        "check": hot.check.check,
        "entry": hot.entry,
        "fn": hot.fn,
    }
    args = [f"a{i}" for i in range(hot.count)]
    lines = [f"if len(args) != {hot.count} or global_state() != modes:", "    return MISS"]
    if args:
        lines.append(f"{', '.join(args)}{',' if len(args) == 1 else ''} = args")
    tensors = [args[i] for i in hot.tensors]
    if tensors:
        lines += [
            "try:",
            f"    if {' or '.join(t + '.is_nested' for t in tensors)}:  # (torch's C++ tensor guards abort on one)",
            "        return MISS",
            "except AttributeError:  # (not a tensor where one was)",
            "    return MISS",
        ]
    lines += [f"if not check({', '.join(tensors)}):", "    return MISS"]
    for i, key in hot.others:
        namespace[f"key_{i}"] = key
        lines += [f"if leaf_key(a{i}) != key_{i}:", "    return MISS"]
    lines += ["if context_state is not None and context_state() != context:", "    return MISS"]
    if hot.graphed is None:
        lines.append(f"return entry(fn, args, {hot.count})")
    else:
        lines += _replay(hot, args, namespace)
    function = f"hot_{_identifier(name)}"
    source = f"def {function}(args, context_state):\n" + "".join(f"    {line}\n" for line in lines)
    if earlier is not None and earlier.source == source:
        code = earlier.code
    else:
        module = compile(source, f"<minicomp hot path: {function}>", "exec")
        code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(code, namespace, function), source, code


def _replay(hot, args: list[str], namespace: dict) -> list[str]:
    """The lines that replay a graphed signature's record and return its outputs."""
    graphed, record, entry = hot.graphed, hot.record(), hot.entry
    plan = record.plan
    namespace.update(record_ref=hot.record, records=graphed.records, graphed=graphed, clock=graphed.graphs.clock)
    namespace.update(plan=plan, use_count=torch._C._storage_Use_Count, copy_inputs=copy_inputs)
    # the record's inputs are the entry's tensor slots among the arguments
    inputs = args if entry.slots is None else [args[i] for i in entry.slots]
    if entry.unflatten is not None:
        namespace["finish"] = entry.unflatten
        finish = "finish({})"
    else:
        namespace["assemble"] = entry.outputs.assemble
        finish = "assemble({}, args)"
    lines = ["record = record_ref()", "if record is None or records.get(()) is not record:", "    return MISS"]
    lines += _addresses(record, inputs, namespace)
    if plan.copied:  # (clones made after the replay: the generic way, its inputs copied there)
        replayed = "graphed.replay_recorded(record, [" + ", ".join(inputs) + "])"
        return [*lines, "return " + finish.format(replayed)]
    if record.buffers:
        lines.append(f"copy_inputs(record.buffers, [{', '.join(inputs)}])")
    lines += ["graphed.misses = 0", "record.used = next(clock)"]
    storages = [f"s{m}" for m in range(len(plan.memories))]
    namespace.update({f"memory_{m}": memory.ptr for m, memory in enumerate(plan.memories)})
    if storages:  # the last call's storages again where no caller holds them (else plan.ready decides)
        names = ", ".join(storages) + ("," if len(storages) == 1 else "")
        lines += [
            "handed = record.handed",
            f"{names} = handed if len(handed) == {len(storages)} else {(None,) * len(storages)}",
            *_any_of(
                f"{s} is None or use_count({s}._cdata) > 1 or {s}.data_ptr() != memory_{m}"
                for m, s in enumerate(storages)
            ),
            f"    {names} = record.handed = plan.ready(handed)",
        ]
    lines.append("record.launch()")
    outputs = _outputs(record, inputs, storages, namespace)
    if any("outputs[" in o for o in outputs):
        lines.append("outputs = record.outputs")
    return [*lines, f"return {finish.format('[' + ', '.join(outputs) + ']')}"]


def _addresses(record, inputs: list[str], namespace: dict) -> list[str]:
    """The check that each input the graph reads in place is at its captured address."""
    if not record.static_ptrs:
        return []
    if len(record.static_ptrs) > _MANY_ADDRESSES and _same_ptrs is not None:
        namespace.update(same_ptrs=_same_ptrs, ptrs=record.ptrs, slots=record.slots)
        return [f"if not same_ptrs([{', '.join(inputs)}], ptrs, slots):", "    return MISS"]
    namespace.update({f"ptr_{i}": ptr for i, ptr in record.static_ptrs})
    return [*_any_of(f"{inputs[i]}.data_ptr() != ptr_{i}" for i, _ in record.static_ptrs), "    return MISS"]


def _any_of(conditions) -> list[str]:
    """`if a or b ...:` over one line, or one condition a line where there are several."""
    conditions = list(conditions)
    if len(conditions) == 1:
        return [f"if {conditions[0]}:"]
    return ["if (", *(f"    {c}" + (" or" if k < len(conditions) - 1 else "") for k, c in enumerate(conditions)), "):"]


def _outputs(record, inputs: list[str], storages: list[str], namespace: dict) -> list[str]:
    """Each output's expression, as graph_outputs.OutputPlan.hand_out makes it."""
    plan = record.plan
    made = [f"outputs[{i}]" for i in range(len(record.outputs))]  # (a value that is not a tensor: as it is)
    for storage, memory in zip(storages, plan.memories):
        for view in memory.views:
            namespace[f"on_{view.index}"] = view.on
            made[view.index] = f"on_{view.index}({storage})"
    for i in plan.aliased:
        made[i] = f"outputs[{i}].detach()"
    for slot, view in plan.of_inputs:  # (offsets from the caller's first element)
        value = inputs[slot]
        made[view.index] = (
            f"{value}.as_strided({tuple(view.shape)}, {tuple(view.stride)}, {value}.storage_offset() + {view.offset})"
        )
    for i in plan.empty:
        o = record.outputs[i]
        namespace[f"empty_{i}"] = (o.dtype, o.device)
        made[i] = f"torch.empty_strided({tuple(o.shape)}, {o.stride()}, dtype=empty_{i}[0], device=empty_{i}[1])"
        namespace["torch"] = torch
    return made


def _identifier(name) -> str:
    if not isinstance(name, str):
        return "call"
    return "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in name) or "call"
