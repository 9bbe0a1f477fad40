"""Horizontal fusion's limit: values that share nothing, each reading a large buffer, run apart.

Rule 4 of fusion.py puts the materialized values of one stage and shape into one pointwise kernel.
For values that read the same inputs that saves reads; for values that share nothing it saves only
launches, and it costs memory: the merged kernel runs after every producer of what it reads, so
all those buffers are alive at once. DLRM's backward casts each table's float32 gradient (a
scatter's [100000, 64], 24 MiB) to bf16: 26 casts in one kernel held all 26 float32 buffers
(625 MiB) at once; 26 kernels let the schedule (schedule.py, by modeled peak) run each cast right
after its scatter and free the float32 buffer.

    kernel: to_copy_1 <- index_put_1, ..., to_copy_26 <- index_put_26   (one kernel)
 -> to_copy_1 <- index_put_1 | ... | to_copy_26 <- index_put_26        (a kernel each)

The same holds for what such a kernel writes: a backward recomputes each layer's norm output from
its saved inputs, all of the same stage and shape; in one kernel, every layer's [rows, hidden]
value was allocated at the start of the backward, beside the logits' gradient (Llama's peak, 64 MiB
of it). A kernel each lets the schedule run each just before the matmuls that read it.

Stores are grouped by the loads they share (transitively); a group that reads a buffer the graph
computes (not an input, which the caller keeps alive anyway) or writes a value of at least config
"apart_bytes" is a kernel of its own, and so is a group that reads inputs alone where the kernel's
stores add up to that much (a backward's recomputations: BERT's per-layer LayerNorm outputs, 6 MiB
each, and the float32 copies of q, k and v its attention's gradient reads); the other groups stay
together (a decode step's small values keep their one launch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from minicomp import config
from minicomp.ir import Graph, TensorMeta
from minicomp.plan.steps import Kernel, PointwiseKernel


def apart(graph: Graph, kernels: list[Kernel], fill: Callable[[Kernel], Kernel]) -> list[Kernel]:
    """`kernels` with each pointwise kernel's unrelated large-reading groups of stores split off
    (`fill` computes a kernel's nodes and loads from its stores), numbered again in order."""
    out: list[Kernel] = []
    for kernel in kernels:
        parts = _parts(graph, kernel, fill) if isinstance(kernel, PointwiseKernel) and len(kernel.stores) > 1 else None
        if parts is None:
            out.append(kernel)
            continue
        out += [fill(PointwiseKernel(0, kernel.stage, kernel.shape, stores)) for stores in parts]
    if len(out) == len(kernels):
        return kernels
    order = {name: i for i, name in enumerate(graph.order)}
    out.sort(key=lambda k: (k.stage, order[k.stores[0]]))
    return [replace(k, index=i) for i, k in enumerate(out)]


def _parts(graph: Graph, kernel: Kernel, fill) -> list[list[str]] | None:
    """The kernel's stores in the kernels they should be, or None to keep it whole."""
    least = config.get("apart_bytes")
    recomputing = sum(_computed_bytes(graph, n) for n in kernel.stores) >= least
    loads = {}
    for name in kernel.stores:
        read = set(fill(PointwiseKernel(0, kernel.stage, kernel.shape, [name])).loads)
        if recomputing and all(graph[n].is_input for n in read):  # a value recomputed from saved ones
            read = {n for n in read if _ties(graph, n, least)}
        loads[name] = read
    groups: list[tuple[list[str], set[str]]] = []
    for name in kernel.stores:  # merge every group that shares a load with this store
        stores, reads = [name], set(loads[name])
        for group in [g for g in groups if g[1] & reads]:
            groups.remove(group)
            stores, reads = group[0] + stores, group[1] | reads
        groups.append((stores, reads))
    large = [
        g
        for g in groups
        if any(_computed_bytes(graph, n) >= least for n in (*g[1], *g[0]))
        or (recomputing and all(graph[n].is_input for n in g[1]))
    ]
    if len(groups) < 2 or not large:
        return None
    rest = [name for g in groups if g not in large for name in g[0]]
    parts = [g[0] for g in large] + ([rest] if rest else [])
    position = {name: i for i, name in enumerate(kernel.stores)}
    return sorted((sorted(p, key=position.get) for p in parts), key=lambda p: position[p[0]])


def _ties(graph: Graph, name: str, least: int) -> bool:
    """Whether reading `name` ties two recomputations to one kernel: anything but a small input
    (a mask every layer's recomputed value reads), which each kernel reads again for little.
    (Values computed from computed ones keep every shared load: RoPE's q and k share cos and sin.)"""
    node = graph[name]
    meta = node.meta
    return not node.is_input or not isinstance(meta, TensorMeta) or meta.numel * meta.dtype.itemsize * 16 >= least


def _computed_bytes(graph: Graph, name: str) -> int:
    """Bytes of a buffer the graph computes; 0 for an input (its caller keeps it alive)."""
    node = graph[name]
    if node.is_input or not isinstance(node.meta, TensorMeta):
        return 0
    return node.meta.numel * node.meta.dtype.itemsize
