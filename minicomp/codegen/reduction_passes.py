"""Which pass over the row computes each reduction of a reduction kernel (codegen/reduction.py).

A looped kernel walks its rows once per level of reduction dependence: pass k computes the
reductions whose operand needs the results of pass k - 1 (softmax: the max, then the sum of
exp(x - max)), and a value stored over the whole space goes in the first pass that has what it
needs. One algebraic rule saves a pass: a sum of exp(a - m), m the max of `a` over the same row,
is accumulated in the max's pass (online softmax, `online_partner`), so cross-entropy's forward
reads its logits once. A persistent kernel holds its row, so its levels only order its lines.
"""

from __future__ import annotations

from minicomp.ir import Ref
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.reductions import spec
from minicomp.plan.fusion import Kernel, Plan


def passes(plan: Plan, kernel: Kernel) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
    """(level, needs, online): reduction -> its pass (1 + the latest pass whose results its
    operand needs); node -> the latest pass whose results it needs (0: none); and, in a looped
    kernel, sum -> the max it is accumulated with online."""
    graph = plan.graph
    members = set(kernel.nodes)
    position = graph.position
    computed = sorted((n for n in members if n in position), key=position.__getitem__)

    def propagate(level: dict[str, int]) -> dict[str, int]:
        needs: dict[str, int] = {}
        for name in computed:
            before = max((needs.get(i, 0) for i in graph[name].inputs()), default=0)
            if plan.kinds[name] is NodeKind.REDUCTION:
                level.setdefault(name, before + 1)
                needs[name] = level[name]
            else:
                needs[name] = before
        return needs

    level: dict[str, int] = {}
    propagate(level)
    online: dict[str, str] = {}
    if kernel.looped:
        for name in list(level):
            partner = online_partner(plan, kernel, name)
            if partner is not None and level[name] == level[partner] + 1:
                online[name] = partner
        # only the merged levels are kept; propagate recomputes the others from them
        level = {m: level[m] for m in online.values()} | {s: level[m] for s, m in online.items()}
    return level, propagate(level), online


def online_partner(plan: Plan, kernel: Kernel, name: str) -> str | None:
    """The max `m` when `name` is sum(exp(a - m)) over the same row, with m = amax(a)."""
    graph = plan.graph
    r = spec(graph[name], graph)
    if r.combine != "sum" or r.divide != 1:
        return None
    node = graph[r.source]
    if node.op_name != "exp" or plan.kinds.get(r.source) is not NodeKind.POINTWISE:
        return None
    inner = node.args[0]
    sub = graph[inner.name] if isinstance(inner, Ref) else None
    if sub is None or sub.op_name != "sub" or len(sub.args) < 2 or sub.kwargs.get("alpha", 1) != 1:
        return None
    a, m = sub.args[0], sub.args[1]
    if not (isinstance(a, Ref) and isinstance(m, Ref)) or plan.kinds.get(m.name) is not NodeKind.REDUCTION:
        return None
    mr = spec(graph[m.name], graph)
    if mr.combine != "max" or mr.source != a.name or mr.dims != r.dims or not mr.keepdim:
        return None
    if m.name in kernel.loads or not graph[a.name].meta.dtype.is_floating_point:
        return None
    return m.name
