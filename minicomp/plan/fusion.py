"""Fusion: decide which nodes become which kernels, and in what order things run.

The rules, in order:

1. Every node is classified (ops.classify): pointwise and view nodes can live
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
4. Materialized values of the same stage and shape share one pointwise kernel
   (horizontal fusion: q and k of RoPE come out of one launch); the reductions
   of one space and stage share one reduction kernel (mean and variance, the
   max and the sum of softmax), which also writes any materialized value of
   its stage shaped like its space that it reads (add + RMSNorm writes `h`).

The plan is everything codegen needs and nothing it must ask back: each
kernel's kind ("pointwise"; codegen has one writer and one template per kind),
the nodes it computes, the buffers it reads and writes, and the strides of
every value a kernel writes (`Plan.strides`, from layout.py).

Why two nodes did not fuse is recorded as a `Refusal` you can print.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from minicomp.ir import Graph, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.layout import output_strides
from minicomp.lowering.ops.reductions import spec
from minicomp.plan.reduction_space import ReductionSpace, reduction_form, row_itemsize


@dataclass
class Kernel:
    index: int
    kind: str  # "pointwise" or "reduction": how codegen writes it
    stage: int
    shape: tuple[int, ...]  # the iteration space (a reduction kernel's: the reduced value's shape)
    stores: list[str]  # nodes this kernel writes
    nodes: list[str] = field(default_factory=list)  # pointwise/view/reduction nodes it computes
    loads: list[str] = field(default_factory=list)  # buffers it reads
    reduced: tuple[int, ...] = ()  # a reduction kernel's reduced dims of `shape`
    looped: bool = False  # a reduction kernel: walks its rows RBLOCK at a time (else holds them whole)
    rblock: int = 0  # a reduction kernel's RBLOCK: the row elements a program holds at once
    outer: bool = False  # a reduction kernel whose rows, not its reduced dims, are contiguous in memory
    split: tuple[str, int] | None = None  # (reduction, K): this kernel computes its K partial results
    group: int = 0  # rows a program takes in turn, when it computes row-group partials (`grouped`)
    grouped: list[str] = field(default_factory=list)  # row-group partials: one row of each a program

    @property
    def form(self) -> str:
        """How a reduction kernel walks its rows, as the plan and the kernel header say it."""
        text = f"looped, {self.rblock} a step" if self.looped else f"persistent, RBLOCK {self.rblock}"
        if self.outer:
            text += ", rows contiguous"
        if self.split:
            text = f"split {self.split[1]} ways for {self.split[0]}, " + text
        if self.group:
            text += f"; {self.group} rows a program, partial column results of {', '.join(self.grouped)}"
        return text

    @property
    def name(self) -> str:
        """mc_fused_<ops it computes, first six>_<index>: names say what is fused."""
        words: list[str] = []
        for op in self.op_names:
            if op not in words:
                words.append(op)
        text = "_".join(w.strip("_") for w in words[:6]) or "copy"
        return f"mc_fused_{text}_{self.index}"

    op_names: list[str] = field(default_factory=list)


@dataclass
class Extern:
    node: str
    stage: int


@dataclass(frozen=True)
class Refusal:
    producer: str
    consumer: str
    reason: str

    def __str__(self) -> str:
        return f"{self.producer} -> {self.consumer}: {self.reason}"


@dataclass
class Plan:
    graph: Graph
    steps: list[Kernel | Extern]
    materialized: set[str]
    refusals: list[Refusal]
    stage_of: dict[str, int]
    kinds: dict[str, str]  # node -> "input", "pointwise", "view", "reduction" or "extern"
    strides: dict[str, tuple[int, ...]]  # value a kernel writes -> the strides it is allocated with
    spaces: dict[str, ReductionSpace] = field(default_factory=dict)  # node -> the reduction space it is in

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def __str__(self) -> str:
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel) and step.kind == "reduction":
                lines.append(
                    f"kernel {step.name}  stage {step.stage}  reduction over {list(step.shape)} "
                    f"dims {list(step.reduced)} ({step.form})"
                )
                lines.append(f"    computes {step.nodes}")
                lines.append(f"    reads {step.loads}  writes {step.stores}")
            elif isinstance(step, Kernel):
                lines.append(f"kernel {step.name}  stage {step.stage}  space {list(step.shape)}")
                lines.append(f"    computes {step.nodes}")
                lines.append(f"    reads {step.loads}  writes {step.stores}")
            else:
                node = self.graph[step.node]
                lines.append(f"extern {step.node} = {node.op_name}  stage {step.stage}")
        if self.refusals:
            lines.append("not fused:")
            lines += [f"    {r}" for r in self.refusals]
        return "\n".join(lines)


def plan(graph: Graph) -> Plan:
    kinds, reasons = _classify(graph)
    stage, space, splits = _stages(graph, kinds)
    materialized = _materialized(graph, kinds, stage, space)
    kernels = [
        _filled(graph, kernel, kinds, stage, materialized)
        for kernel in _group_kernels(graph, kinds, stage, space, materialized)
    ]
    steps: list[Kernel | Extern] = []
    for s in range(max(stage.values(), default=0) + 1):
        steps += [Extern(n, s) for n in graph.order if kinds[n] == "extern" and stage[n] == s]
        steps += [k for k in kernels if k.stage == s]
    strides = {name: output_strides(graph[name].meta) for k in kernels for name in k.stores}
    refusals = _refusals(graph, kernels, kinds, reasons) + splits
    return Plan(graph, steps, materialized, refusals, stage, kinds, strides, space)


def is_fusible(kind: str) -> bool:
    """Can the node be computed inside any kernel (pointwise and view ops)?"""
    return kind in ("pointwise", "view")


def is_computed(kind: str) -> bool:
    """Is the node computed by a kernel (fusible nodes and reductions)?"""
    return kind in ("pointwise", "view", "reduction")


def _classify(graph: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """(kind of each node, why each extern is one)."""
    kinds, reasons = {}, {}
    metas = [graph[n].meta for n in graph.order if isinstance(graph[n].meta, TensorMeta)]
    accelerated = any(m.device.type != "cpu" for m in metas)
    for name in graph.order:
        node = graph[name]
        if node.is_input:
            kinds[name] = "input"
        elif accelerated and isinstance(node.meta, TensorMeta) and node.meta.device.type == "cpu":
            kinds[name], reasons[name] = "extern", "a CPU value (`x[:, 2] = 0.0` makes one) in a GPU function"
        else:
            kinds[name], reasons[name] = ops.classify(node, graph)
    _views_between_externs(graph, kinds, reasons)
    return kinds, reasons


COPIES = {"clone", "contiguous", "lift_fresh_copy"}  # view rules that are copies in ATen


def _views_between_externs(graph: Graph, kinds, reasons) -> None:
    """A chain of views read only by ATen calls stays an ATen view of the value it starts from:
    SDPA takes `v` as the transposed view of its projection, and a matmul the [B*S, D] view of a
    norm's output, where a kernel would write a copy. The chain must start at an ATen result, an
    input, or a computed value that a kernel writes with the strides eager gives it. A graph
    output that is such a view of an ATen result (a matmul's [B, S, D] view of its [B*S, D]
    result) is returned as that view too, as eager returns it; a view of an input is still
    copied (the caller's input must not come back as an output). A copy (`clone`) is a
    computed value here: GQA's repeated k and v, saved for the backward as [B, K, G, S, D] and
    read by attention as a [B, H, S, D] view, are written once, not once in each shape."""
    mutated = {src for _, src in graph.mutations}
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    chain: set[str] = set()
    fresh: set[str] = set()  # chain members whose base is an ATen result, not an input

    def root(name: str) -> bool:
        if kinds[name] in ("input", "extern") or name in chain:
            return True
        meta = graph[name].meta
        computed = kinds[name] != "view" or graph[name].op_name in COPIES  # a clone is written like any value
        return computed and isinstance(meta, TensorMeta) and output_strides(meta) == meta.stride

    for name in graph.order:
        node = graph[name]
        if (
            kinds[name] == "view"
            and node.op_name in ops.VIEWS
            and node.op_name not in COPIES
            and name not in mutated
            and all(root(i) for i in node.inputs())
        ):
            is_fresh = all(kinds[i] == "extern" or i in fresh for i in node.inputs())
            if name in outputs and not is_fresh:
                continue
            chain.add(name)
            if is_fresh:
                fresh.add(name)
    for name in reversed(graph.order):
        users = graph.users(name)
        if name in chain and (all(kinds[u] == "extern" for u in users) if users else name in fresh):
            if users or name in outputs:
                kinds[name], reasons[name] = "extern", "a view of an ATen result read only by ATen calls"


def _space_of(graph: Graph, name: str) -> ReductionSpace:
    """The space of reduction `name`'s kernel; a row-group partial's is the row kernel's
    (split_reductions.py): its source's, reduced over the dims after the leading rows."""
    if name in graph.grouped:
        source = graph[graph.grouped_source(name)].meta
        return ReductionSpace(source.shape, tuple(range(graph.grouped[name], source.ndim)), source.device)
    r = spec(graph[name], graph)
    source = graph[r.source].meta
    return ReductionSpace(source.shape, r.dims, source.device)


def _rides_in_row_kernel(graph: Graph, name: str) -> bool:
    """A row-group partial or its chunks view: evaluated at the row kernel's index, whatever its shape."""
    return name in graph.grouped or any(u in graph.grouped for u in graph.users(name))


def _stages(graph: Graph, kinds):
    """(stage of each node, the reduction space of each node in a reduction kernel, refusals)."""
    stage: dict[str, int] = {}
    space: dict[str, ReductionSpace] = {}
    refusals: list[Refusal] = []
    for name in graph.order:
        node, kind = graph[name], kinds[name]
        inputs = node.inputs()
        s = max((stage[i] for i in inputs), default=0)
        if kind == "input":
            stage[name] = 0
            continue
        if kind == "extern":
            stage[name] = s + 1
            continue
        reading = {space[i]: i for i in inputs if stage[i] == s and i in space}
        mine = _space_of(graph, name) if kind == "reduction" else next(iter(reading), None)
        meta = node.meta
        fits = mine is None or (
            isinstance(meta, TensorMeta)
            and (mine.fits(meta.shape) or _rides_in_row_kernel(graph, name))
            and meta.device == mine.device
        )
        if set(reading) <= ({mine} if mine else set()) and fits:
            stage[name] = s
        else:  # a kernel boundary: what it reads of stage s is written by then
            stage[name] = s + 1
            other = next(i for sp, i in reading.items() if sp != mine or not fits)
            why = (
                f"{name} {'reduces' if kind == 'reduction' else 'reads'} a reduction over {space[other]}"
                + (f" but is shaped {list(meta.shape)}" if mine and not fits else "")
                + (f" and {name} is one over {mine}" if kind == "reduction" and mine != space[other] else "")
            )
            if other in graph.split:
                why = f"{name} combines the {graph.split[other][1]} partial results of a split reduction"
            refusals.append(Refusal(other, name, why))
            if kind != "reduction":
                mine = None
        if mine is not None:
            space[name] = mine
    _sink(graph, stage, space)
    return stage, space, refusals


def _sink(graph: Graph, stage, space) -> None:
    """Move reductions that wait for nothing to the latest stage of their space they can join:
    cross-entropy's count of non-ignored targets goes into the kernel of its final sum."""
    groups: dict[tuple, list[str]] = {}
    for name in graph.order:
        if name in space:
            groups.setdefault((stage[name], space[name]), []).append(name)
    for (s, sp), members in sorted(groups.items(), key=lambda kv: -kv[0][0]):
        later = sorted(t for (t, other) in groups if other == sp and t > s)
        if not later:
            continue
        target = later[0]
        users = {u for m in members for u in graph.users(m)} - set(members)
        # a user at the target stage must be in that kernel: an extern of the stage runs before
        # its kernels, and another kernel of the stage cannot read what this one writes
        if all(stage[u] > target or (stage[u] == target and space.get(u) == sp) for u in users):
            for m in members:
                stage[m] = target
            groups.setdefault((target, sp), []).extend(members)


def _materialized(graph: Graph, kinds, stage, space) -> set[str]:
    needed = {n for n in graph.order if not is_computed(kinds[n])}
    needed |= {o for o in graph.outputs if isinstance(o, str)}
    needed |= {src for _, src in graph.mutations}
    for name in graph.order:
        if kinds[name] == "extern":
            needed |= set(graph[name].inputs())
        if name in space:  # a reduction kernel's value read outside it
            here = (stage[name], space[name])
            if any((stage[u], space.get(u)) != here for u in graph.users(name)):
                needed.add(name)
    return needed


def _group_kernels(graph: Graph, kinds, stage, space, materialized) -> list[Kernel]:
    reductions: dict[tuple, Kernel] = {}
    for name in graph.order:
        if name in space:
            key = (stage[name], space[name])
            if key not in reductions:
                source = graph.grouped_source(name) if name in graph.grouped else spec(graph[name], graph).source
                hosts = any((stage[n], space.get(n)) == key for n in graph.grouped)
                looped, rblock, outer = reduction_form(
                    space[name], graph[source].meta.stride, row_itemsize(graph, source), hosts
                )
                reductions[key] = Kernel(
                    0,
                    "reduction",
                    stage[name],
                    space[name].shape,
                    [],
                    reduced=space[name].dims,
                    looped=looped,
                    rblock=rblock,
                    outer=outer,
                )
            if name in graph.grouped:  # its partials are the row groups: one a program
                rows = math.prod(graph[graph.grouped_source(name)].meta.shape[: graph.grouped[name]])
                reductions[key].group = rows // graph.split[name][1]
                reductions[key].grouped.append(name)
            elif name in graph.split:
                reductions[key].split = graph.split[name]
            if name in materialized:
                reductions[key].stores.append(name)
    pointwise: dict[tuple, Kernel] = {}
    for name in graph.order:
        node = graph[name]
        if name in materialized and is_fusible(kinds[name]) and name not in space:
            home = _reduction_reading(graph, name, stage, space, reductions) or _grouped_host(
                node, stage[name], reductions
            )
            if home is not None:
                home.stores.append(name)
                continue
            key = (stage[name], node.meta.shape, node.meta.device)
            if key not in pointwise:
                pointwise[key] = Kernel(0, "pointwise", stage[name], node.meta.shape, [])
            pointwise[key].stores.append(name)
    kernels = [k for k in reductions.values() if k.stores] + list(pointwise.values())
    kernels.sort(key=lambda k: (k.stage, graph.order.index(k.stores[0])))
    return [replace(k, index=i) for i, k in enumerate(kernels)]


def _reduction_reading(graph: Graph, name: str, stage, space, reductions) -> Kernel | None:
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


def _grouped_host(node, stage: int, reductions) -> Kernel | None:
    """A grouped reduction kernel of `stage` over `node`'s shape: it writes `node` too, in the
    pass over its rows that adds up its partials (a gradient and the column sums of its bias)."""
    meta = node.meta
    for (s, sp), kernel in reductions.items():
        if kernel.group and s == stage and sp.shape == meta.shape and sp.device == meta.device:
            return kernel
    return None


def _is_loadable(name: str, stage: int, kinds, stage_of, materialized) -> bool:
    """Can a kernel of `stage` read `name` from memory instead of computing it?"""
    if not is_computed(kinds[name]):
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
        stack += graph[name].inputs()
    nodes = [n for n in graph.order if n in seen and not _is_loadable(n, kernel.stage, kinds, stage_of, materialized)]
    loads = [n for n in graph.order if n in seen and n not in nodes]
    return replace(kernel, nodes=nodes, loads=loads, op_names=[graph[n].op_name for n in nodes])


def _refusals(graph: Graph, kernels: list[Kernel], kinds, reasons) -> list[Refusal]:
    refusals = []
    for name in graph.order:
        if kinds[name] == "extern":
            for src in graph[name].inputs():
                if is_fusible(kinds[src]):
                    refusals.append(Refusal(src, name, f"{name} runs as an ATen call: {reasons[name]}"))
            for user in graph.users(name):
                if is_fusible(kinds[user]):
                    refusals.append(Refusal(name, user, f"{name} runs as an ATen call: {reasons[name]}"))
    by_stage: dict[int, list[Kernel]] = {}
    for k in kernels:
        if k.kind == "pointwise":
            by_stage.setdefault(k.stage, []).append(k)
    for group in by_stage.values():
        for a, b in zip(group, group[1:]):
            refusals.append(Refusal(a.name, b.name, f"iteration spaces differ: {list(a.shape)} vs {list(b.shape)}"))
    return refusals
