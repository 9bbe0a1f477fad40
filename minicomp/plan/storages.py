"""Which values of a plan share memory, how many bytes each memory holds, and when it is free.

A generated `call` holds its values in Python names and `del`s each after the
step that uses it last (codegen/wrapper.py), so a buffer is freed when the last
name that reaches its memory goes. A kernel's store and an extern ATen call's
result own new memory; a view extern (`view`, `permute`, any op whose schema
returns an alias of its input) and a `getitem` of a multi-output call reach the
memory of what they came from. Graph outputs and mutated inputs live past the
call. Inputs are freed by their last use only where the caller hands them over
(AOTAutograd's boxed backward drops its saved tensors as it passes them).

Used by schedule.py (an order of the steps that needs less memory) and by
codegen/reuse.py (a kernel's output written over an input that dies there).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from minicomp.ir import TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.ops import NodeKind
from minicomp.plan.steps import Extern, Kernel, Plan

# ops whose schema promises a new tensor but which may hand back their input's memory
MAY_ALIAS = {"_unsafe_view", "contiguous", "reshape", "to", "lift_fresh", "alias", "detach"}


def uses(plan: Plan, step: Kernel | Extern) -> set[str]:
    """The values a step touches: an extern call's result and arguments, a kernel's loads and stores."""
    if isinstance(step, Extern):
        return {step.node, *plan.graph[step.node].inputs()}
    return set(step.loads) | set(step.stores)


def defines(step: Kernel | Extern) -> list[str]:
    return [step.node] if isinstance(step, Extern) else list(step.stores)


def nbytes(meta) -> int:
    if isinstance(meta, TensorMeta):
        return meta.numel * meta.dtype.itemsize
    if isinstance(meta, (tuple, list)):
        return sum(nbytes(m) for m in meta)
    return 0


@dataclass(frozen=True)
class Storages:
    owner: dict[str, str]  # value -> the value whose memory it is (itself when it owns new memory)
    size: dict[str, int]  # owner -> bytes
    kept: frozenset[str]  # owners that outlive the call: outputs, mutated inputs
    inputs: frozenset[str]  # owners that are graph inputs
    shared: frozenset[str]  # owners whose memory another value reaches too (a view of it)

    @staticmethod
    def of(plan: Plan) -> Storages:
        graph = plan.graph
        owner: dict[str, str] = {}
        for name in graph.order:
            node = graph[name]
            source = _aliased(node) if plan.kinds.get(name) is NodeKind.EXTERN else None
            owner[name] = owner.get(source, name) if source else name
        for value, padded in plan.interior.items():  # written inside a padded buffer: plan/padded_writes.py
            owner[value] = padded
        size = {name: nbytes(graph[name].meta) for name in graph.order if owner[name] == name}
        outputs = [o for o in graph.outputs if isinstance(o, str)]
        mutated = [n for pair in graph.mutations for n in pair]
        return Storages(
            owner,
            size,
            frozenset(owner[n] for n in outputs + mutated if n in owner),
            frozenset(owner[n] for n in graph.inputs),
            frozenset(o for v, o in owner.items() if v != o),
        )

    def owns_memory(self, name: str) -> bool:
        """Whether `name` holds memory of its own that no other value reaches."""
        return self.owner.get(name) == name and name not in self.shared


def _aliased(node) -> str | None:
    """The value whose memory an extern's result is, or None when the result is new memory."""
    if node.target is operator.getitem:
        return node.inputs()[0]
    if node.op_name in ops.VIEWS or node.op_name in MAY_ALIAS or not isinstance(node.target, torch._ops.OpOverload):
        inputs = node.inputs()
        return inputs[0] if inputs else None
    returns = node.target._schema.returns
    if any(r.alias_info is not None for r in returns):
        inputs = node.inputs()
        return inputs[0] if inputs else None
    return None


def exclusive_outputs(plan: Plan) -> frozenset[str]:
    """Graph outputs whose memory is theirs alone: owned (no view of another value, not inside a
    padded buffer), reached by no other value, no input, returned once; or the one output that
    views memory the call made, where no other output reaches that memory (a padded product's
    slice, saved for the backward: plan/pad_matmuls.py). A forward's saved activation of this kind
    is memory its backward may take over (dispatch/dynamo.py `donated`)."""
    storages = Storages.of(plan)
    outputs = [o for o in plan.graph.outputs if isinstance(o, str)]
    apart = results_apart(plan, storages)
    reach = [o if o in apart else storages.owner.get(o, o) for o in outputs]
    made = {name for step in plan.steps for name in defines(step)}  # no input, constant or padded buffer
    return frozenset(
        o
        for o, base in zip(outputs, reach)
        if reach.count(base) == 1 and (o in apart or (base in made and (storages.owns_memory(o) or base != o)))
    )


def results_apart(plan: Plan, storages: Storages) -> frozenset[str]:
    """The results of multi-result extern calls that made new memory (a custom op's list, an ATen
    op returning no alias), where nothing views them: each result is memory of its own, though
    `Storages` counts them as the call's."""
    graph = plan.graph
    found = set()
    for name, owner in storages.owner.items():
        if owner == name or graph[name].target is not operator.getitem or storages.owner.get(owner) != owner:
            continue
        if graph[name].inputs()[0] != owner or owner not in plan.kinds or plan.kinds[owner] is not NodeKind.EXTERN:
            continue
        found.add(name)
    viewed = {o for v, o in storages.owner.items() if v != o and v not in found}  # a view of some call's result
    return frozenset(n for n in found if storages.owner[n] not in viewed)
