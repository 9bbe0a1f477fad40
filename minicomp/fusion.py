"""Fusion: decide which nodes become which kernels, and in what order things run.

The rules, in order:

1. Every node is classified (ops.classify): pointwise and view nodes can live
   inside a kernel; everything else is an extern ATen call in the wrapper.
   The kinds live in the plan (`Plan.kinds`); the IR is not changed.
2. A value is *materialized* (written to memory) when something outside the
   kernels needs it: a graph output, an extern's input, a mutated input.
   Everything else is recomputed inside whichever kernel needs it, so a chain
   of pointwise and view ops costs one read of its inputs and one write.
3. Each node gets a *stage*: how many extern calls lie on its longest path from
   the inputs. Externs of stage s run before the kernels of stage s, which run
   before externs of stage s + 1; so no kernel waits on a later ATen call.
4. Materialized values of the same stage and shape share one kernel
   (horizontal fusion: q and k of RoPE come out of one launch).

The plan is everything codegen needs and nothing it must ask back: each
kernel's kind ("pointwise"; codegen has one writer and one template per kind),
the nodes it computes, the buffers it reads and writes, and the strides of
every value a kernel writes (`Plan.strides`, from layout.py).

Why two nodes did not fuse is recorded as a `Refusal` you can print.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minicomp import ops
from minicomp.ir import Graph
from minicomp.layout import output_strides


@dataclass
class Kernel:
    index: int
    kind: str  # "pointwise": how codegen writes it
    stage: int
    shape: tuple[int, ...]
    stores: list[str]  # nodes this kernel writes
    nodes: list[str] = field(default_factory=list)  # pointwise/view nodes it computes
    loads: list[str] = field(default_factory=list)  # buffers it reads

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
    kinds: dict[str, str]  # node -> "input", "pointwise", "view" or "extern"
    strides: dict[str, tuple[int, ...]]  # value a kernel writes -> the strides it is allocated with

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def __str__(self) -> str:
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
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
    stage = _stages(graph, kinds)
    materialized = _materialized(graph, kinds)
    kernels = [
        _filled(graph, kernel, kinds, stage, materialized)
        for kernel in _group_kernels(graph, kinds, stage, materialized)
    ]
    steps: list[Kernel | Extern] = []
    for s in range(max(stage.values(), default=0) + 1):
        steps += [Extern(n, s) for n in graph.order if kinds[n] == "extern" and stage[n] == s]
        steps += [k for k in kernels if k.stage == s]
    strides = {name: output_strides(graph[name].meta) for k in kernels for name in k.stores}
    return Plan(graph, steps, materialized, _refusals(graph, kernels, kinds, reasons), stage, kinds, strides)


def is_fusible(kind: str) -> bool:
    return kind in ("pointwise", "view")


def _classify(graph: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """(kind of each node, why each extern is one)."""
    kinds, reasons = {}, {}
    for name in graph.order:
        node = graph[name]
        if node.is_input:
            kinds[name] = "input"
        else:
            kinds[name], reasons[name] = ops.classify(node, graph)
    return kinds, reasons


def _stages(graph: Graph, kinds) -> dict[str, int]:
    stage: dict[str, int] = {}
    for name in graph.order:
        before = max((stage[i] for i in graph[name].inputs()), default=0)
        stage[name] = before + 1 if kinds[name] == "extern" else before
    return stage


def _materialized(graph: Graph, kinds) -> set[str]:
    needed = {n for n in graph.order if not is_fusible(kinds[n])}
    needed |= {o for o in graph.outputs if isinstance(o, str)}
    needed |= {src for _, src in graph.mutations}
    for name in graph.order:
        if kinds[name] == "extern":
            needed |= set(graph[name].inputs())
    return needed


def _group_kernels(graph: Graph, kinds, stage, materialized) -> list[Kernel]:
    groups: dict[tuple, Kernel] = {}
    for name in graph.order:
        node = graph[name]
        if name in materialized and is_fusible(kinds[name]):
            key = (stage[name], node.meta.shape, node.meta.device)
            if key not in groups:
                groups[key] = Kernel(len(groups), "pointwise", stage[name], node.meta.shape, [])
            groups[key].stores.append(name)
    return sorted(groups.values(), key=lambda k: (k.stage, k.index))


def _is_loadable(name: str, stage: int, kinds, stage_of, materialized) -> bool:
    """Can a kernel of `stage` read `name` from memory instead of computing it?"""
    if not is_fusible(kinds[name]):
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
        by_stage.setdefault(k.stage, []).append(k)
    for group in by_stage.values():
        for a, b in zip(group, group[1:]):
            refusals.append(Refusal(a.name, b.name, f"iteration spaces differ: {list(a.shape)} vs {list(b.shape)}"))
    return refusals
