"""Values written once where recomputing them costs more reads (fusion.py's rule 3, priced).

A pointwise or view value that no ATen call, output or reduction of another kernel needs is not
written: each kernel that needs it recomputes it from what it loads. That is what makes a chain of
pointwise ops one read and one write. It stops paying where the chain is read by kernels of
several stages: a pre-norm transformer's residual stream `h_k = h_{k-1} + block_k(norm(h_{k-1}))`
is read by layer k's norm kernel and, through `h_{k+1}`, by every later norm kernel, so the norm of
layer k recomputed the embedding lookup and every block's output before it: k + 2 loads of
[B, S, d] where one would do (a 2-layer Llama's last norm read five).

`worth_writing` prices each such value v against the plan's kernels. Writing it costs one store of
its bytes B, by a kernel of its own stage that computes it anyway and can store it (a pointwise
kernel of its shape, a reduction kernel over its shape: add + norm writes h). Each kernel of a later
stage that computes it then loads B instead of the loads v dominates there: those only v's own
computation reads, every path from them to the kernel's stores passing through v (each counted at
most at the kernel's element count: a table read through an embedding's indexes reads one row an
element). v is written where the loads it saves outweigh the store and the loads it adds. Values
are priced latest first: a later kernel that will load a value already chosen, through which every
path from v to its stores passes (the stream value after v), does not compute v and saves nothing
by it.

A 16-bit value is held in float32 while computed and rounded when stored. A written one is
therefore rounded wherever it is computed (`rounded`, codegen's `as_stored`), so every kernel of the
graph uses the value its loaders read. Another graph recomputing it would not know to: a training
step's backward recomputes the forward's values unrounded, and compared with a saved `amax` of the
rounded one it matched nowhere (NaN gradients). So 16-bit values are written only in a graph no
other graph recomputes from (`inference`: no backward follows); a training step's graphs write
values that are stored exactly (float32, float64, integers). A training forward's saved 16-bit
values, and those its backward computes again, are rounded where it computes them only where a
selection is computed from them, through anything the backward may recompute (`compared`); the
backward rounds the recomputed ones alike. Elsewhere the forward's own uses keep float32, as
Inductor's do.
"""

from __future__ import annotations

import math

import networkx as nx

from minicomp.ir import Graph, TensorMeta, dtypes
from minicomp.plan.steps import Kernel, PointwiseKernel, ReductionKernel


def worth_writing(
    graph: Graph, kernels: list[Kernel], kinds, stage, materialized: set[str], inference: bool = False
) -> set[str]:
    """The values not yet written whose recomputation in kernels of later stages reads more bytes
    than writing them once and loading them there. Latest first: a later kernel that will load a
    chosen value computed from this one (the stream value after it) saves nothing by this one.
    16-bit values only where `inference` (no other graph recomputes them)."""
    hosts: dict[str, list[Kernel]] = {}
    for kernel in kernels:
        for name in kernel.nodes:
            if kinds[name].fusible and name not in materialized:
                hosts.setdefault(name, []).append(kernel)
    trees: dict[int, tuple[dict, dict[str, int]]] = {}  # id(kernel) -> its dominator tree, saved bytes
    found: set[str] = set()
    for name in reversed([n for n in graph.order if n in hosts]):
        meta, computing = graph[name].meta, hosts[name]
        later = [k for k in computing if k.stage > stage[name]]
        if not later or not isinstance(meta, TensorMeta) or (meta.dtype in dtypes.LOW_PRECISION and not inference):
            continue
        if not any(_stores(k, meta) for k in computing if k.stage == stage[name]):
            continue
        size, saved = meta.numel * meta.dtype.itemsize, 0
        for k in later:
            if id(k) not in trees:
                trees[id(k)] = _dominators(graph, k)
            parent, only = trees[id(k)]
            if not _behind(parent, name, {u for u in found if stage[u] < k.stage}):
                saved += only.get(name, 0) - size
        if saved > size:
            found.add(name)
    return found


# ops whose backward compares elements with their result (as a reduction kernel or an ATen call),
# or exponentiates their difference (`exp(x - logsumexp(x))`: a result rounded from the unrounded
# x's is up to half a 16-bit step off the saved x's, 12% of a gradient at 32-64)
SELECTIONS = frozenset(
    {"amax", "amin", "max", "min", "median", "nanmedian", "kthvalue", "mode", "dist", "logsumexp", "logcumsumexp"}
)


def compared(graph: Graph, saved: frozenset[str], recomputed: frozenset[str] = frozenset()) -> frozenset[str]:
    """The values of `saved` (a training forward's values its backward reads) and of `recomputed`
    (those it computes again) from which the backward may compute a value it compares with a
    saved result: those a selection (amax, amin, max, min, median, kthvalue, mode, logsumexp: a
    reduction kernel or an ATen call) is computed from, the selection included, through every
    value the partition may recompute, ATen calls too (an `lgamma` before an amax is recomputed by
    the backward); the walk stops at inputs and at the compute-intensive calls the partition never
    recomputes (matmuls, convolutions, attention), whose results both graphs load alike. Only
    these are rounded wherever the forward computes them (`rounded`), and the recomputed ones
    wherever the backward does (its `compile_graph(rounded=...)`): the backward's `x == amax` must
    see the x the forward's amax saw, else it matches nowhere (NaN gradients), and its
    `exp(x - logsumexp)` the x the sum saw. Every other saved value is held in float32 by the
    forward's own uses, as Inductor's forward does, and rounded only where stored."""
    if not saved and not recomputed:  # an inference graph, or a backward (and no import of AOTAutograd's partitioner)
        return frozenset()
    from torch._functorch.partitioners import get_default_op_list  # loaded already by the partition

    never_recomputed = get_default_op_list().compute_intensive_ops
    cone: set[str] = set()
    stack = [n for n in graph.order if not graph[n].is_input and graph[n].op_name in SELECTIONS]
    while stack:
        name = stack.pop()
        node = graph[name]
        if name in cone or node.is_input or getattr(node.target, "overloadpacket", None) in never_recomputed:
            continue
        cone.add(name)
        stack.extend(a for a in graph[name].inputs() if a in graph.nodes)
    return frozenset(saved | recomputed) & cone


def rounded(graph: Graph, written: set[str] | frozenset[str]) -> frozenset[str]:
    """The values of a 16-bit dtype among `written` (and a forward's saved ones): each kernel
    computing one rounds it as its store does."""
    return frozenset(
        n
        for n in written
        if n in graph.nodes and isinstance(graph[n].meta, TensorMeta) and graph[n].meta.dtype in dtypes.LOW_PRECISION
    )


def _behind(parent: dict, name: str, chosen: set[str]) -> bool:
    """Does every path from `name` to the kernel's stores pass through a chosen value (one the
    kernel will load: of an earlier stage than the kernel's)?"""
    node = parent.get(name)
    while node is not None and node != ROOT:
        if node in chosen:
            return True
        node = parent.get(node)
    return False


def unread(kernels: list[Kernel], stage, written: set[str]) -> set[str]:
    """The values `worth_writing` chose that no kernel of a later stage loads after all (another
    chosen value computed from them is loaded instead): not worth their store."""
    loaded = {name for k in kernels for name in k.loads if name in written and k.stage > stage[name]}
    return written - loaded


def _stores(kernel: Kernel, meta: TensorMeta) -> bool:
    """Would fusion.py give a value of `meta`'s shape, materialized at the kernel's stage, to this
    kernel (a pointwise kernel of that shape; a reduction kernel over it reading the value)?"""
    return type(kernel) in (PointwiseKernel, ReductionKernel) and tuple(kernel.shape) == tuple(meta.shape)


ROOT = ("stores",)  # the root of a kernel's walk: every store hangs from it


def _dominators(graph: Graph, kernel: Kernel) -> tuple[dict, dict[str, int]]:
    """(the kernel's dominator tree walked from its stores: node -> its immediate dominator; computed
    value -> bytes of the kernel's loads that only it needs, every path from such a load to the
    stores passing through the value). A load counts at most the kernel's elements (a table read
    through an embedding's indexes, one row an element)."""
    computed, loads, root = set(kernel.nodes), set(kernel.loads), ROOT
    walk = nx.DiGraph()
    walk.add_edges_from((root, s) for s in kernel.stores)
    for node in computed:
        walk.add_edges_from((node, i) for i in graph[node].inputs() if i in computed or i in loads)
    parent = nx.immediate_dominators(walk, root)
    numel, below = math.prod(kernel.shape), {}
    for load in loads & set(parent):
        meta = graph[load].meta
        if isinstance(meta, TensorMeta):
            below[load] = min(meta.numel, numel) * meta.dtype.itemsize
    children: dict = {}
    for node, up in parent.items():
        if node != root:
            children.setdefault(up, []).append(node)
    order, stack = [], [root]
    while stack:  # the dominator tree, parents before children
        node = stack.pop()
        order.append(node)
        stack += children.get(node, [])
    found: dict[str, int] = {}
    for node in reversed(order[1:]):  # each node's bytes: its loads' and its children's
        found[node] = below.get(node, 0) + sum(found[c] for c in children.get(node, []))
    return parent, {node: found[node] - below.get(node, 0) for node in found if node in computed}
