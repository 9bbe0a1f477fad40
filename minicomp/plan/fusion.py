"""Fusion: decide which nodes become which kernels, and in what order things run.

The rules, in order:

1. Every node is classified (ops.classify, a `NodeKind`): pointwise and view nodes can live
   inside any kernel, reductions (sum, mean, amax, ...) inside a reduction
   kernel; everything else is an extern ATen call in the wrapper. The kinds
   live in the plan (`Plan.kinds`); the IR is not changed.
2. Each node gets a *stage*: how many kernel boundaries lie on its longest
   path from the inputs. An extern call is one. So is a reduction's result
   reaching a reduction over another space, or a node that reads reductions
   of two spaces: a reduction kernel computes the reductions of one *space*
   (the reduced value's shape and its reduced dims, `ReductionSpace`) and
   everything of its stage that depends on them. Externs of stage s run
   before the kernels of stage s, which run before externs of stage s + 1.
3. A value is *materialized* (written to memory) when something outside its
   kernel needs it: a graph output, an extern's input, a mutated input, a
   later stage's use of a reduction kernel's value. Everything else is
   recomputed inside whichever kernel needs it, so a chain of pointwise and
   view ops costs one read of its inputs and one write, and a norm one read
   of `x` and one write of `y` (its producers are inlined in the reduction
   kernel, its consumers that broadcast the result back are fused after it).
   A value that kernels of later stages would recompute from more bytes than
   it holds (a pre-norm transformer's residual stream) is written once by a
   kernel of its stage that computes it anyway (recompute.py).
4. Materialized values of the same stage and shape share one pointwise kernel
   (horizontal fusion: q and k of RoPE come out of one launch); the reductions
   of one space and stage share one reduction kernel (mean and variance, the
   max and the sum of softmax), which also writes any materialized value of
   its stage shaped like its space that it reads (add + RMSNorm writes `h`).
5. A reduction kernel holds a reduction's result for the row it reduces only: where a value
   reads it at another row (`s.t()`, `s.flip(0)` of a row sum `s`; row_reads.py finds them by
   evaluating the kernel's indexes), the edge where that path leaves its own place is cut, so
   the value there is written and its reader reads it in a later kernel. The plan's refusals
   name the edge and the indexes.

The plan (steps.py) is everything codegen needs and nothing it must ask back:
each kernel's kind (its class: `PointwiseKernel`, `ReductionKernel`, `ScatterKernel`, `ScanKernel`; codegen has
one writer and one template per kind), the nodes it computes, the buffers it
reads and writes, and the strides of every value a kernel writes
(`Plan.strides`, from layout.py).

Rules 1-3 are stages.py; this module groups the materialized values into
kernels (rule 4) and fills in what each computes and reads. Why two nodes did
not fuse is recorded as a `Refusal` you can print.
"""

from __future__ import annotations

import math
from dataclasses import replace

from minicomp.ir import Graph
from minicomp.lowering.layout import attention_mask, mask_strides, output_strides
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.reductions import spec
from minicomp.plan import apart, matmul, recompute, row_reads, scan, scatter, stages
from minicomp.plan.reduction_space import ReductionSpace, reduction_form, row_itemsize
from minicomp.plan.steps import Extern, Kernel, Plan, PointwiseKernel, ReductionKernel, Refusal


def plan(
    graph: Graph,
    cut: frozenset[tuple[str, str]] = frozenset(),
    kept_inline: frozenset[str] = frozenset(),
    inference: bool = False,
    saved: frozenset[str] = frozenset(),
    recomputed: frozenset[str] = frozenset(),
    rounded: frozenset[str] = frozenset(),
) -> Plan:
    """The kernels and extern calls that compute `graph`, in stage order (schedule.py reorders).
    `cut`: (value, user) edges to plan across a kernel boundary, whatever the rules say
    (pipeline.py's retry after a kernel codegen could not write). `kept_inline`: values rule 3's
    pricing may not write (below: a kernel would launch only to write them). `inference`: no
    other graph recomputes this one's values (no backward follows), so rule 3 may write 16-bit
    values too (recompute.py). `saved`: a training forward's values its backward reads; a 16-bit
    one a selection (amax, max, median...) is computed from is rounded wherever it is computed, as
    the value the backward loads is (`Plan.rounded`, recompute.compared); `recomputed`: its values
    the backward computes again, rounded alike. `rounded`: a backward's values its forward rounded,
    rounded here too."""
    kinds, reasons = stages.classify(graph)
    cut, misread, written, rounds = frozenset(cut), [], set(), 0
    while True:  # rule 5: a reduction read at another row than its own is read from memory
        stage, space, boundaries = stages.assign_stages(graph, kinds, cut)
        materialized = stages.materialized(graph, kinds, stage, space) | written
        kernels = [
            _filled(graph, kernel, kinds, stage, materialized)
            for kernel in _kernels(graph, kinds, stage, space, materialized)
        ]
        kernels = apart.apart(graph, kernels, lambda k: _filled(graph, k, kinds, stage, materialized))
        found = [m for k in kernels if isinstance(k, ReductionKernel) for m in row_reads.misreads(graph, k, kinds)]
        found = [m for m in found if (m.value, m.reader) not in cut]
        if found:
            cut |= {(m.value, m.reader) for m in found}
            misread += [Refusal(m.value, m.reader, str(m)) for m in found]
            continue
        rounds += 1  # (any set of written values is a valid plan: a few rounds settle it)
        more = (
            recompute.worth_writing(graph, kernels, kinds, stage, materialized, inference) - kept_inline
            if rounds <= 4
            else set()
        )
        if more:  # rule 3, priced
            written |= more
            continue
        if rounds <= 5 and recompute.unread(kernels, stage, written):
            written -= recompute.unread(kernels, stage, written)
            continue
        break  # (a read through an edge already cut is codegen's to refuse)
    told = {(m.producer, m.consumer) for m in misread}
    boundaries += misread + [Refusal(r, u, _CUT) for r, u in sorted(cut - told)]
    by_stage: dict[int, list[Kernel | Extern]] = {}  # a stage's externs in graph order, then its kernels
    for n in graph.order:
        if kinds[n] is NodeKind.EXTERN:
            by_stage.setdefault(stage[n], []).append(Extern(n, stage[n]))
    for k in kernels:
        by_stage.setdefault(k.stage, []).append(k)
    steps: list[Kernel | Extern] = [step for s in sorted(by_stage) for step in by_stage[s]]
    strides = {name: output_strides(graph[name].meta) for k in kernels for name in k.stores}
    bounded = _aligned_masks(graph, steps, strides)
    refusals = _refusals(graph, kernels, kinds, reasons) + boundaries
    made = Plan(
        graph,
        steps,
        materialized,
        refusals,
        stage,
        kinds,
        strides,
        space,
        rounded=recompute.rounded(graph, written | recompute.compared(graph, saved, recomputed) | rounded),
        row_bounded=bounded,
    )
    made = matmul.templated(made, _filled)  # matmuls as Triton templates with their epilogues (plan/matmul.py)
    alone = {n for k in made.kernels if k.stores and set(k.stores) <= written for n in k.stores}
    if alone:  # a template took what else their writer stored: it would launch for them alone
        return plan(graph, cut, kept_inline | alone, inference, saved)
    return made


_CUT = "cut by the caller: the kernel that fused them could not be written"


def _aligned_masks(graph: Graph, steps: list, strides: dict[str, tuple[int, ...]]) -> frozenset[str]:
    """An attention mask a kernel writes for SDPA is allocated the way SDPA's kernels need it
    (layout.mask_strides: rows padded to 8 elements), unless the graph returns it (a caller, a
    backward, reads its strides) or another ATen call reads it: the wrapper copies such a mask on a
    GPU, and any other (codegen/module.py). Returns the masks so laid out: their stores keep the
    row apart in the index (`Plan.row_bounded`), so that a length whose rows need no padding (S a
    multiple of 8) writes the text of the others, a kernel family's one text (issue #42)."""
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    externs = {step.node for step in steps if isinstance(step, Extern)}
    bounded = set()
    for step in steps:
        mask = attention_mask(graph[step.node]) if isinstance(step, Extern) else None
        if mask not in strides or mask in outputs:
            continue
        # kernels read it with these strides; another ATen call (a view) would see the padding
        if all(u not in externs or attention_mask(graph[u]) == mask for u in graph.users(mask)):
            padded = mask_strides(graph[mask].meta.shape, strides[mask])
            strides[mask] = padded or strides[mask]
            bounded.add(mask)
    return frozenset(bounded)


def _kernels(graph: Graph, kinds, stage, space, materialized) -> list[Kernel]:
    """The kernels, each with what it stores, in the order they run within a stage, numbered."""
    reductions = _reduction_kernels(graph, stage, space, materialized)
    pointwise: dict[tuple, PointwiseKernel] = {}
    for name in graph.order:
        node = graph[name]
        if name in materialized and kinds[name].fusible and name not in space:
            home = _reduction_reading(graph, name, stage, space, reductions) or _row_group_kernel(
                node, stage[name], reductions
            )
            if home is not None:
                home.stores.append(name)
                continue
            key = (stage[name], node.meta.shape, node.meta.device)
            if key not in pointwise:
                pointwise[key] = PointwiseKernel(0, stage[name], node.meta.shape, [])
            pointwise[key].stores.append(name)
    kernels = [k for k in reductions.values() if k.stores] + list(pointwise.values())
    kernels += scatter.kernels(graph, kinds, stage)  # a kernel of atomic adds a scatter (plan/scatter.py)
    kernels += scan.kernels(graph, kinds, stage)  # a kernel a scan (plan/scan.py)
    kernels.sort(key=lambda k: (k.stage, graph.position[k.stores[0]]))
    return [replace(k, index=i) for i, k in enumerate(kernels)]


def _reduction_kernels(graph: Graph, stage, space, materialized) -> dict[tuple, ReductionKernel]:
    """(stage, space) -> the kernel of the reductions of that space and stage, with the ones it stores."""
    reductions: dict[tuple, ReductionKernel] = {}
    for name in graph.order:
        if name not in space:
            continue
        key = (stage[name], space[name])
        if key not in reductions:
            reductions[key] = _reduction_kernel(graph, name, key, stage, space)
        kernel = reductions[key]
        if name in graph.grouped:  # its partials are the row groups: one a program
            rows = math.prod(graph[graph.grouped_source(name)].meta.shape[: graph.grouped[name]])
            kernel.group = rows // graph.partials[name][1]
            kernel.grouped.append(name)
        elif name in graph.partials:
            kernel.split = graph.partials[name]
        if name in materialized:
            kernel.stores.append(name)
    return reductions


def _reduction_kernel(graph: Graph, name: str, key: tuple, stage, space) -> ReductionKernel:
    """An empty kernel over reduction `name`'s space, in the form its rows take (reduction_form)."""
    sp: ReductionSpace = space[name]
    source = graph.grouped_source(name) if name in graph.grouped else spec(graph[name], graph).source
    takes_row_groups = any((stage[n], space.get(n)) == key for n in graph.grouped)
    looped, rblock, outer = reduction_form(sp, graph[source].meta.stride, row_itemsize(graph, source), takes_row_groups)
    return ReductionKernel(0, stage[name], sp.shape, [], reduced=sp.dims, looped=looped, rblock=rblock, outer=outer)


def _reduction_reading(graph: Graph, name: str, stage, space, reductions) -> ReductionKernel | None:
    """The reduction kernel of `name`'s stage that reads it and can write it too (it is shaped
    like the kernel's space), or None. Found by walking its users within the stage."""
    meta = graph[name].meta
    seen, stack = set(), list(graph.users(name))
    while stack:
        user = stack.pop()
        if user in seen or stage.get(user) != stage[name]:
            continue
        seen.add(user)
        if user in space:
            sp = space[user]
            if sp.shape == meta.shape and sp.device == meta.device:
                return reductions[(stage[user], sp)]
            continue
        stack += graph.users(user)
    return None


def _row_group_kernel(node, stage: int, reductions) -> ReductionKernel | None:
    """A reduction kernel of `stage` over `node`'s shape that takes row groups: it writes `node`
    too, in the pass over its rows that adds up its partials (a gradient and the column sums of
    its bias)."""
    meta = node.meta
    for (s, sp), kernel in reductions.items():
        if kernel.group and s == stage and sp.shape == meta.shape and sp.device == meta.device:
            return kernel
    return None


def _is_loadable(name: str, stage: int, kinds, stage_of, materialized) -> bool:
    """Can a kernel of `stage` read `name` from memory instead of computing it?"""
    if not kinds[name].computed:
        return True
    return name in materialized and stage_of[name] < stage


def _filled(graph: Graph, kernel: Kernel, kinds, stage_of, materialized) -> Kernel:
    """`kernel` with what it computes and reads: walk back from the stores to what can be loaded."""
    seen: set[str] = set()
    stack = list(kernel.stores)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if _is_loadable(name, kernel.stage, kinds, stage_of, materialized):
            continue
        stack += scatter.operands(graph, kinds, name)  # (a scatter's filled `self` is not read)
    ordered = sorted(seen, key=graph.position.__getitem__)
    nodes = [n for n in ordered if not _is_loadable(n, kernel.stage, kinds, stage_of, materialized)]
    computed = set(nodes)
    loads = [n for n in ordered if n not in computed]
    return replace(kernel, nodes=nodes, loads=loads, op_names=[graph[n].op_name for n in nodes])


def _refusals(graph: Graph, kernels: list[Kernel], kinds, reasons) -> list[Refusal]:
    """Edges cut by an extern call, and pointwise kernels of one stage over different spaces."""
    refusals = []
    for name in graph.order:
        if kinds[name] is NodeKind.EXTERN:
            for src in graph[name].inputs():
                if kinds[src].fusible:
                    refusals.append(Refusal(src, name, f"{name} runs as an ATen call: {reasons[name]}"))
            for user in graph.users(name):
                if kinds[user].fusible:
                    refusals.append(Refusal(name, user, f"{name} runs as an ATen call: {reasons[name]}"))
    by_stage: dict[int, list[Kernel]] = {}
    for k in kernels:
        if isinstance(k, PointwiseKernel):
            by_stage.setdefault(k.stage, []).append(k)
    for group in by_stage.values():
        for a, b in zip(group, group[1:]):
            why = f"iteration spaces differ: {list(a.shape)} vs {list(b.shape)}"
            if a.shape == b.shape:  # (or devices differ)
                why = "kept apart: they share no load and one reads a large computed buffer (apart.py)"
            refusals.append(Refusal(a.name, b.name, why))
    return refusals
