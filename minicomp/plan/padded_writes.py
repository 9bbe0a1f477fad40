"""A value padded with zeros is written inside its padded buffer by the kernel that computes it.

    x = <a kernel's store>                     [M, N]
    x_padded = constant_pad_nd(x, [0, Np - N])  [M, Np]: a kernel of its own, reading x
 -> x_padded = empty([M, Np]); x_padded[:, N:] = 0
    x = x_padded[:, :N]                        written there by its kernel, at row stride Np

plan/pad_matmuls.py pads a matmul's operands; where an operand is computed by a kernel that
cannot compute the padded value itself (a reduction's output: the logits' gradient of a
cross-entropy backward sums each row first), the plan wrote `x` and then copied it into the
padded buffer, both alive at once: twice the logits' size at a GPT-2 step's peak. Here the pad's
kernel goes, `x` is allocated as the interior of the padded buffer (`Plan.interior`, its memory
the padded value's: plan/storages.py), and the wrapper zeroes the border once (codegen/module.py).

Applies to a pad with zeros at the end of dims only, whose kernel reads nothing but `x` (or a
reshape of its leading dims: GPT-2's [B, S, V] gradient padded as [B * S, Vp]), where `x` is a
kernel's store, neither an output nor mutated, that nothing else reads (the padded value may be
an output: a chunked loss's padded gradient, chunked_rows.Region.joint): a kernel reading a view
of it indexes the view at its meta's strides (BERT's bias gradient, a row sum of the logits'
gradient, keeps the copy).
"""

from __future__ import annotations

import dataclasses

from minicomp.ir import Ref, TensorMeta
from minicomp.lowering.indexing import contiguous_strides, row_padded_strides
from minicomp.lowering.ops import VIEWS
from minicomp.plan.steps import MatmulKernel, Plan, PointwiseKernel, ReductionKernel, ScatterKernel

RESHAPES = {"view", "_unsafe_view", "reshape"}  # views that lay the same elements out in other dims


def written_padded(plan: Plan) -> Plan:
    """`plan` with each such pad's kernel removed and its input written inside the padded buffer."""
    graph = plan.graph
    mutated = {n for pair in graph.mutations for n in pair}
    kept = {o for o in graph.outputs if isinstance(o, str)} | mutated
    used = _used(graph, kept)
    producer = {name: k for k in plan.kernels for name in k.stores}
    strides, interior, dropped = dict(plan.strides), dict(plan.interior), set()
    for kernel in plan.kernels:
        if type(kernel) is not PointwiseKernel or len(kernel.stores) != 1 or kernel.stores[0] in mutated:
            continue
        padded = kernel.stores[0]
        source = _padded_value(graph, padded)
        chain = _reshapes(graph, source, producer) if source is not None else None
        if chain is None:
            continue
        stored = chain[-1]
        if (
            set(kernel.loads) != {stored}
            or isinstance(producer[stored], (ScatterKernel, MatmulKernel))
            or not _read_only_through(plan, stored, {padded, *chain}, kept - {padded}, used)
        ):
            continue
        layout = _interior_strides(graph, padded, source, stored, strides)
        if layout is None:
            continue
        strides[stored], interior[stored] = layout, padded
        dropped.add(id(kernel))
    if not dropped:
        return plan
    steps = [s for s in plan.steps if id(s) not in dropped]
    return dataclasses.replace(plan, steps=steps, strides=strides, interior=interior)


def border(plan: Plan, stored: str) -> list[tuple[int, int, int]]:
    """(dim, start, length) of each slab of `plan.interior[stored]` outside the padded value: zeroed."""
    padded = plan.interior[stored]
    inner, outer = plan.graph[_padded_value(plan.graph, padded)].meta, plan.graph[padded].meta
    return [(d, n, m - n) for d, (n, m) in enumerate(zip(inner.shape, outer.shape)) if m > n]


def _reshapes(graph, source: str, producer: dict) -> list[str] | None:
    """[source, ..., the kernel's store it reshapes]: views that keep the last dim, down to a
    kernel's store (just [source] where the pad reads a store itself); None if there is none."""
    chain = [source]
    while chain[-1] not in producer:
        node = graph[chain[-1]]
        inputs = node.inputs()
        if node.op_name not in RESHAPES or len(inputs) != 1:
            return None
        below = graph[inputs[0]].meta
        if not isinstance(below, TensorMeta) or below.shape[-1:] != node.meta.shape[-1:]:
            return None
        chain.append(inputs[0])
    return chain


def _read_only_through(plan: Plan, stored: str, chain: set[str], kept: set[str], used: set[str]) -> bool:
    """Is `stored` kept past the call by nothing, and read by nothing but the reshapes down to the
    pad and kernels that load it (through views of it inlined in them, or not)? Those index it at
    its plan strides (codegen/kernel.py `offset_of`): BERT's bias gradient, a column sum of the
    logits' gradient. A matmul template or a scatter reads its operands at their traced strides,
    and a view the wrapper makes of it has the traced ones too."""
    inside = {
        node
        for k in plan.kernels
        if type(k) in (PointwiseKernel, ReductionKernel) and stored in k.loads
        for node in k.nodes
    }
    graph = plan.graph

    def read_inside(name: str) -> bool:
        for user in (u for u in graph.users(name) if u in used):
            if user in chain:
                if graph[user].op_name in RESHAPES and not read_inside(user):
                    return False
            elif user in kept or user not in inside:
                return False
            elif graph[user].op_name in VIEWS and (user in plan.materialized or not read_inside(user)):
                return False
        return True

    return not (chain & kept) and read_inside(stored)


def _interior_strides(graph, padded: str, source: str, stored: str, strides: dict) -> tuple[int, ...] | None:
    """The strides that put `stored` where the pad's input lies in the padded buffer: the buffer's
    own where the pad reads the store; else (reshapes of the leading dims) rows a padded row apart,
    which needs a pad of the last dim alone."""
    outer, inner = graph[padded].meta, graph[source].meta
    if stored == source:
        return tuple(strides.get(padded, outer.stride))
    if tuple(outer.shape[:-1]) != tuple(inner.shape[:-1]) or tuple(strides.get(padded, outer.stride)) != tuple(
        contiguous_strides(list(outer.shape))
    ):
        return None
    return row_padded_strides(graph[stored].meta.shape, outer.shape[-1])


def _used(graph, kept: set[str]) -> set[str]:
    """The values whose values are used: kept past the call, computed by an op that is not a view,
    or read by a used value (a view pad_matmuls left behind, read by nothing, is not: the matmul
    it fed now reads the padded operand). One walk from the last node back."""
    used: set[str] = set()
    for name in reversed(graph.order):
        if name in kept or graph[name].op_name not in VIEWS or any(u in used for u in graph.users(name)):
            used.add(name)
    return used


def _padded_value(graph, name: str) -> str | None:
    """x where `name` = constant_pad_nd(x, pads, 0) pads only at the end of dims, same dtype."""
    node = graph[name]
    if node.op_name != "constant_pad_nd" or not isinstance(node.meta, TensorMeta):
        return None
    args = list(node.args) + [node.kwargs.get("value", 0)]
    source, pads, fill = args[0], list(args[1]), args[2]
    if not isinstance(source, Ref) or fill != 0 or any(p != 0 for p in pads[0::2]) or any(p < 0 for p in pads[1::2]):
        return None
    meta = graph[source.name].meta
    if not isinstance(meta, TensorMeta) or meta.dtype != node.meta.dtype:
        return None
    return source.name
