"""Scatter kernels in the plan: where a scatter-accumulate node (lowering/ops/scatters.py) runs,
what its kernel reads, and how its output starts.

A scatter kernel computes one node. Its values' producers fuse into it as they fuse into a
pointwise kernel's store (recomputed inline); the value it starts from (`self`) does not: the
output buffer holds it before the kernel's atomic adds. A `self` that is a constant `full` (an
embedding's zero gradient table) is never computed for it: the wrapper allocates the output
filled. Any other `self` is copied into the output, so the kernel's stage reads it
from memory: a value written by an earlier stage, or an input the caller owns (copied, never
added into). Readers of the result wait for the kernel: the result is available one stage
later, as an extern call's is (`input_stage`).
"""

from __future__ import annotations

from minicomp.ir import Graph
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.core import bind
from minicomp.lowering.ops.scatters import scatter_of
from minicomp.plan.steps import Refusal, ScatterKernel


def fill_of(graph: Graph, name: str):
    """The constant a scatter's output starts as when its `self` is a constant `full` (allocated
    filled by the wrapper, whoever else reads that `full`: the tables of one shape in a backward
    share one zero `full`), else None."""
    base = graph[scatter_of(graph[name], graph).base]
    if base.is_input or base.op_name != "full":
        return None
    value = bind(base).get("fill_value")
    return value if isinstance(value, (int, float, bool)) and base.meta.dtype == graph[name].meta.dtype else None


def base_of(graph: Graph, name: str) -> str | None:
    """The value copied into a scatter's output before its kernel runs, or None when it starts filled."""
    return None if fill_of(graph, name) is not None else scatter_of(graph[name], graph).base


def operands(graph: Graph, kinds, name: str) -> list[str]:
    """What computing `name` reads: its inputs; a scatter's without a `self` it starts filled as."""
    inputs = graph[name].inputs()
    if kinds[name] is not NodeKind.SCATTER or base_of(graph, name) is not None:
        return inputs
    base = scatter_of(graph[name], graph).base
    return [i for i in inputs if i != base]


def input_stage(kinds, stage, name: str) -> int:
    """The stage from which `name` can be read: a scatter's or a scan's result (a kernel of its
    own: `NodeKind.alone`) one stage after its kernel's."""
    return stage[name] + kinds[name].alone


def materialized(graph: Graph, kinds) -> set[str]:
    """Scatter results (the kernel writes them) and the values copied into them."""
    found = set()
    for name in graph.order:
        if kinds[name] is NodeKind.SCATTER:
            found.add(name)
            base = base_of(graph, name)
            if base is not None:
                found.add(base)
    return found


def stage_of(graph: Graph, kinds, name: str, stage, space) -> tuple[int, Refusal | None]:
    """(the stage of scatter `name`'s kernel, why it is later than its inputs'). Its values and
    indexes are computed inline, unless they are a reduction kernel's values of that stage (which
    it cannot compute); a `self` it copies must be written by an earlier stage."""
    s, why = after_reductions(kinds, stage, space, name, operands(graph, kinds, name), "scatters")
    if why:
        return s, why
    base = base_of(graph, name)
    if base is not None and kinds[base].computed and not kinds[base].alone and stage[base] == s:
        return s + 1, Refusal(base, name, f"{name} starts from a copy of {base}, written by an earlier kernel")
    return s, None


def after_reductions(kinds, stage, space, name: str, operands: list[str], verb: str) -> tuple[int, Refusal | None]:
    """(the stage of a kernel of its own (`NodeKind.alone`) for `name`, which computes `operands`
    inline, why it is later than theirs): the stage after a reduction kernel's value it reads,
    which it cannot compute."""
    s = max((input_stage(kinds, stage, i) for i in operands), default=0)
    for i in operands:
        if stage[i] == s and i in space:
            return s + 1, Refusal(i, name, f"{name} {verb} values that a reduction over {space[i]} computes")
    return s, None


def kernels(graph: Graph, kinds, stage) -> list[ScatterKernel]:
    """A kernel for each scatter node, over its values' space."""
    found = []
    for name in graph.order:
        if kinds[name] is NodeKind.SCATTER:
            space = scatter_of(graph[name], graph).space
            found.append(
                ScatterKernel(0, stage[name], space, [name], fill=fill_of(graph, name), base=base_of(graph, name))
            )
    return found
