"""Fusion: decide which nodes become which kernels, and in what order things run.

The rules, in order:

1. Every node is classified (ops.classify): pointwise and view nodes can live
   inside a kernel; everything else is an extern ATen call in the wrapper.
2. A value is *materialized* (written to memory) when something outside the
   kernels needs it: a graph output, an extern's input, a mutated input.
   Everything else is recomputed inside whichever kernel needs it, so a chain
   of pointwise and view ops costs one read of its inputs and one write.
3. Each node gets a *stage*: how many extern calls lie on its longest path from
   the inputs. Externs of stage s run before the kernels of stage s, which run
   before externs of stage s + 1; so no kernel waits on a later ATen call.
4. Materialized values of the same stage and shape share one kernel
   (horizontal fusion: q and k of RoPE come out of one launch).

Why two nodes did not fuse is recorded as a `Refusal` you can print.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minicomp import ops
from minicomp.ir import Graph, TensorMeta


@dataclass
class Kernel:
    index: int
    stage: int
    shape: tuple[int, ...]
    stores: list[str]                               # nodes this kernel writes
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

    def is_loadable(self, name: str, stage: int) -> bool:
        return is_loadable(self.graph, name, stage, self.stage_of, self.materialized)

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
    reasons = _classify(graph)
    stage = _stages(graph)
    materialized = _materialized(graph)
    kernels = _group_kernels(graph, stage, materialized)
    for kernel in kernels:
        _fill_kernel(graph, kernel, stage, materialized)
    steps: list[Kernel | Extern] = []
    for s in range(max(stage.values(), default=0) + 1):
        steps += [Extern(n, s) for n in graph.order if graph[n].kind == "extern" and stage[n] == s]
        steps += [k for k in kernels if k.stage == s]
    return Plan(graph, steps, materialized, _refusals(graph, kernels, reasons), stage)


def is_fusible(kind: str) -> bool:
    return kind in ("pointwise", "view")


def _classify(graph: Graph) -> dict[str, str]:
    reasons = {}
    for name in graph.order:
        node = graph[name]
        if node.kind != "input":
            node.kind, reasons[name] = ops.classify(node, graph)
    return reasons


def _stages(graph: Graph) -> dict[str, int]:
    stage: dict[str, int] = {}
    for name in graph.order:
        node = graph[name]
        before = max((stage[i] for i in node.inputs()), default=0)
        stage[name] = before + 1 if node.kind == "extern" else before
    return stage


def _materialized(graph: Graph) -> set[str]:
    needed = {n for n in graph.order if not is_fusible(graph[n].kind)}
    needed |= {o for o in graph.outputs if isinstance(o, str)}
    needed |= {src for _, src in graph.mutations}
    for name in graph.order:
        if graph[name].kind == "extern":
            needed |= set(graph[name].inputs())
    return needed


def _group_kernels(graph: Graph, stage, materialized) -> list[Kernel]:
    groups: dict[tuple, Kernel] = {}
    for name in graph.order:
        node = graph[name]
        if name in materialized and is_fusible(node.kind):
            key = (stage[name], node.meta.shape, node.meta.device)
            if key not in groups:
                groups[key] = Kernel(len(groups), stage[name], node.meta.shape, [])
            groups[key].stores.append(name)
    return sorted(groups.values(), key=lambda k: (k.stage, k.index))


def is_loadable(graph: Graph, name: str, stage: int, stage_of, materialized) -> bool:
    """Can a kernel of `stage` read `name` from memory instead of computing it?"""
    if not is_fusible(graph[name].kind):
        return True
    return name in materialized and stage_of[name] < stage


def _fill_kernel(graph: Graph, kernel: Kernel, stage_of, materialized) -> None:
    """Walk back from the stores through everything the kernel must compute."""
    seen: set[str] = set()
    stack = list(kernel.stores)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if is_loadable(graph, name, kernel.stage, stage_of, materialized):
            continue
        stack += graph[name].inputs()
    kernel.nodes = [n for n in graph.order if n in seen and is_fusible(graph[n].kind)
                    and not is_loadable(graph, n, kernel.stage, stage_of, materialized)]
    kernel.loads = [n for n in graph.order if n in seen and n not in kernel.nodes]
    kernel.op_names = [graph[n].op_name for n in kernel.nodes]


def _refusals(graph: Graph, kernels: list[Kernel], reasons) -> list[Refusal]:
    refusals = []
    for name in graph.order:
        node = graph[name]
        if node.kind == "extern":
            for src in node.inputs():
                if is_fusible(graph[src].kind):
                    refusals.append(Refusal(src, name, f"{name} runs as an ATen call: {reasons[name]}"))
            for user in graph.users(name):
                if is_fusible(graph[user].kind):
                    refusals.append(Refusal(name, user, f"{name} runs as an ATen call: {reasons[name]}"))
    by_stage: dict[int, list[Kernel]] = {}
    for k in kernels:
        by_stage.setdefault(k.stage, []).append(k)
    for group in by_stage.values():
        for a, b in zip(group, group[1:]):
            refusals.append(Refusal(a.name, b.name, f"iteration spaces differ: {list(a.shape)} vs {list(b.shape)}"))
    return refusals


def output_strides(meta: TensorMeta) -> tuple[int, ...]:
    """Strides to allocate a materialized value with: the traced ones (eager's), unless they overlap.

    Dense results keep eager's layout; a view returned or saved for the backward
    (`q[..., :16]` of a [.., 64] tensor) keeps its strides too, as AOTAutograd's
    backward graph indexes it with them: its buffer spans the view's whole
    extent, and the kernel writes only the view's elements. A broadcast result
    (stride 0) is written densely instead: every element it repeats holds the
    same value, so a reader using stride 0 reads the right one either way."""
    if all(st != 0 or size <= 1 for size, st in zip(meta.shape, meta.stride)):
        return tuple(meta.stride)
    from minicomp.indexing import contiguous_strides

    order = sorted(range(meta.ndim), key=lambda d: (-meta.stride[d], d))
    dense, step = [0] * meta.ndim, 1
    for d in reversed(order):
        dense[d] = step
        step *= max(meta.shape[d], 1)
    return tuple(dense) if step == meta.numel or meta.numel == 0 else tuple(contiguous_strides(meta.shape))
