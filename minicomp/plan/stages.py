"""Rules 1-3 of fusion.py: each node's kind, its stage, and which values are materialized.

A node's *stage* counts the kernel boundaries on its longest path from the inputs (an extern
call is one; so is a reduction's result reaching a reduction over another space). A value is
*materialized* when something outside its kernel needs it.
"""

from __future__ import annotations

from minicomp.ir import Graph, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.layout import output_strides
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.reductions import spec
from minicomp.plan import scan, scatter
from minicomp.plan.reduction_space import ReductionSpace
from minicomp.plan.steps import Refusal

COPIES = {"clone", "contiguous", "lift_fresh_copy"}  # view rules that are copies in ATen


def classify(graph: Graph) -> tuple[dict[str, NodeKind], dict[str, str]]:
    """(kind of each node, why each extern is one)."""
    kinds, reasons = {}, {}
    metas = [graph[n].meta for n in graph.order if isinstance(graph[n].meta, TensorMeta)]
    accelerated = any(m.device.type != "cpu" for m in metas)
    for name in graph.order:
        node = graph[name]
        if node.is_input:
            kinds[name] = NodeKind.INPUT
        elif accelerated and isinstance(node.meta, TensorMeta) and node.meta.device.type == "cpu":
            kinds[name], reasons[name] = NodeKind.EXTERN, "a CPU value (`x[:, 2] = 0.0` makes one) in a GPU function"
        else:
            kinds[name], reasons[name] = ops.classify(node, graph)
    _views_between_externs(graph, kinds, reasons)
    return kinds, reasons


def _views_between_externs(graph: Graph, kinds, reasons) -> None:
    """A chain of views read only by ATen calls stays an ATen view of the value it starts from:
    SDPA takes `v` as the transposed view of its projection, and a matmul the [B*S, D] view of a
    norm's output, where a kernel would write a copy. The chain must start at an ATen result, an
    input, or a computed value that a kernel writes with the strides eager gives it. A graph
    output that is such a view of an ATen result (a matmul's [B, S, D] view of its [B*S, D]
    result) is returned as that view too, as eager returns it, and kernels that read it read
    the view (a padded matmul's product sliced to its columns, saved for the backward: no copy of
    it, plan/pad_matmuls.py); a view of an input is still
    copied (the caller's input must not come back as an output). A copy (`clone`) is a
    computed value here: GQA's repeated k and v, saved for the backward as [B, K, G, S, D] and
    read by attention as a [B, H, S, D] view, are written once, not once in each shape."""
    chain, fresh = _view_chain(graph, kinds)
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    for name in reversed(graph.order):
        users = graph.users(name)
        read_by_aten = bool(users) and all(kinds[u] is NodeKind.EXTERN for u in users)
        if name in chain and (read_by_aten or (name in outputs and name in fresh)):
            if users or name in outputs:
                kinds[name], reasons[name] = NodeKind.EXTERN, "a view of an ATen result read only by ATen calls"
    for name in graph.order:  # a view of a value a kernel writes in other strides than its meta's is computed too
        if (
            name in chain
            and kinds[name] is NodeKind.EXTERN
            and any(_rewritten(graph, kinds, i) for i in graph[name].inputs())
        ):
            kinds[name] = NodeKind.VIEW
            reasons.pop(name, None)


def _rewritten(graph: Graph, kinds, name: str) -> bool:
    """Does a kernel write `name` in other strides than its meta's (an expanded value, written
    dense)? An ATen view of it would then not have the strides its own meta promises."""
    meta = graph[name].meta
    return kinds[name].computed and isinstance(meta, TensorMeta) and output_strides(meta) != meta.stride


def _view_chain(graph: Graph, kinds) -> tuple[set[str], set[str]]:
    """(views that may stay ATen views of where their chain starts, those of them whose base is
    an ATen result rather than an input)."""
    mutated = {src for _, src in graph.mutations}
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    chain: set[str] = set()
    fresh: set[str] = set()

    def root(name: str) -> bool:
        if kinds[name] in (NodeKind.INPUT, NodeKind.EXTERN) or name in chain:
            return True
        meta = graph[name].meta
        # a clone, a cat or a pad is written like any computed value
        op = graph[name].op_name
        computed = kinds[name] is not NodeKind.VIEW or op in COPIES or op in ops.INDEXED
        return computed and isinstance(meta, TensorMeta) and output_strides(meta) == meta.stride

    for name in graph.order:
        node = graph[name]
        if (
            kinds[name] is NodeKind.VIEW
            and node.op_name in ops.VIEWS
            and node.op_name not in COPIES
            and name not in mutated
            and all(root(i) for i in node.inputs())
        ):
            is_fresh = all(kinds[i] is NodeKind.EXTERN or i in fresh for i in node.inputs())
            if name in outputs and not is_fresh:
                continue
            chain.add(name)
            if is_fresh:
                fresh.add(name)
    return chain, fresh


def space_of(graph: Graph, name: str) -> ReductionSpace:
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


def assign_stages(
    graph: Graph, kinds, cut: frozenset[tuple[str, str]] = frozenset()
) -> tuple[dict[str, int], dict[str, ReductionSpace], list[Refusal]]:
    """(stage of each node, the reduction space of each node in a reduction kernel, refusals).
    `cut`: (value of a reduction kernel, user) edges that must cross a kernel boundary (fusion.py says why)."""
    stage: dict[str, int] = {}
    space: dict[str, ReductionSpace] = {}
    refusals: list[Refusal] = []
    for name in graph.order:
        kind, inputs = kinds[name], graph[name].inputs()
        s = max((scatter.input_stage(kinds, stage, i) for i in inputs), default=0)
        if kind.alone:  # a kernel of its own: plan/scatter.py, plan/scan.py
            of = scatter.stage_of if kind is NodeKind.SCATTER else scan.stage_of
            stage[name], why = of(graph, kinds, name, stage, space)
            refusals += [why] if why else []
            continue
        if kind in (NodeKind.INPUT, NodeKind.EXTERN):
            stage[name] = 0 if kind is NodeKind.INPUT else s + 1
            continue
        reading = {space[i]: i for i in inputs if stage[i] == s and i in space}
        mine = space_of(graph, name) if kind is NodeKind.REDUCTION else next(iter(reading), None)
        fits = mine is None or _fits(graph, name, mine)
        severed = any((i, name) in cut for i in inputs if stage[i] == s and i in space)
        if set(reading) <= ({mine} if mine else set()) and fits and not severed:
            stage[name] = s
        else:  # a kernel boundary: what it reads of stage s is written by then
            stage[name] = s + 1
            if not severed:  # a cut edge's refusal is fusion.py's, which knows the index
                other = next(i for sp, i in reading.items() if sp != mine or not fits)
                reason = _boundary_reason(graph, name, kind, other, space[other], mine, fits)
                refusals.append(Refusal(other, name, reason))
            if kind is not NodeKind.REDUCTION:
                mine = None
        if mine is not None:
            space[name] = mine
    _sink(graph, stage, space, cut)
    return stage, space, refusals


def _fits(graph: Graph, name: str, space: ReductionSpace) -> bool:
    """Can `name` be evaluated at the index of a kernel over `space`?"""
    meta = graph[name].meta
    return (
        isinstance(meta, TensorMeta)
        and (space.fits(meta.shape) or _rides_in_row_kernel(graph, name))
        and meta.device == space.device
    )


def _boundary_reason(graph: Graph, name: str, kind, other: str, theirs: ReductionSpace, mine, fits: bool) -> str:
    """Why `name` starts a new stage after reading reduction `other` (over `theirs`)."""
    if other in graph.partials:
        return f"{name} combines the {graph.partials[other][1]} partial results of a split reduction"
    reduces = kind is NodeKind.REDUCTION
    return (
        f"{name} {'reduces' if reduces else 'reads'} a reduction over {theirs}"
        + (f" but is shaped {list(graph[name].meta.shape)}" if mine and not fits else "")
        + (f" and {name} is one over {mine}" if reduces and mine != theirs else "")
    )


def _sink(graph: Graph, stage, space, cut: frozenset[tuple[str, str]] = frozenset()) -> None:
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
        # (not across a cut edge: that user reads the reduction from memory)
        if all(stage[u] > target or (stage[u] == target and space.get(u) == sp) for u in users) and not any(
            (m, u) in cut for m in members for u in users
        ):
            for m in members:
                stage[m] = target
            groups.setdefault((target, sp), []).extend(members)


def materialized(graph: Graph, kinds, stage, space) -> set[str]:
    """The values written to memory: what something outside their kernel needs."""
    needed = {n for n in graph.order if not kinds[n].computed}
    needed |= {o for o in graph.outputs if isinstance(o, str)}
    needed |= {src for _, src in graph.mutations}
    needed |= scatter.materialized(graph, kinds)  # a scatter's result and a value copied into it
    needed |= scan.materialized(graph, kinds)
    for name in graph.order:
        if kinds[name] is NodeKind.EXTERN:
            needed |= set(graph[name].inputs())
        if name in space:  # a reduction kernel's value read outside it
            here = (stage[name], space[name])
            for u in graph.users(name):
                if (stage[u], space.get(u)) == here:
                    continue
                # a row-group partial no row kernel of its stage takes reads its source, not its chunks view
                needed.add(graph.grouped_source(u) if u in graph.grouped else name)
    return needed
