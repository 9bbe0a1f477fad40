"""Matmul kernels folded into another template: chains and siblings (issue #40).

A *chain* (`chainable`): a template's operand a that is all another template writes (an MLP's
hidden layer `relu(x @ w1 + b1)`) is computed where it is read: the inner kernel's product and
epilogue in the outer kernel's prologue, nested to any depth (codegen/matmul_operands.py
`folded_product`), the hidden value never written. A *sibling* (`fold_siblings`, config
"matmul_siblings", off: measured slower, docs/experiments.md): a product only another template's
epilogue reads, computed by that kernel too (its own accumulator and K loop). In "auto",
`chain_ends` takes an MLP's last layer (no epilogue, so timing keeps cuBLAS) into its chain.
"""

from __future__ import annotations

from minicomp import config
from minicomp.ir import Graph
from minicomp.lowering import ops
from minicomp.plan.matmul_reads import (
    at_own_element,
    downstream_to,
    macs,
    members,
    operands,
    read_elsewhere,
    refusal,
)
from minicomp.plan.steps import MatmulKernel, Plan


def chain_ends(plan: Plan, externs: list[str], readers: dict, chosen: dict[str, str]) -> dict[str, str]:
    """In "auto": the matmuls not chosen (no epilogue: an MLP's last layer) whose operand a is the
    epilogue of a chosen template, read by them alone, both widths within config
    "matmul_chain_width": taken too, untimed, so that `_prologues` chains them into one kernel
    (docs/experiments.md: such a chain took 0.62-0.68x the GPU time of a template a layer, itself
    about half of cuBLAS + epilogue's)."""
    graph, width, found = plan.graph, config.get("matmul_chain_width"), {}
    for e in externs:
        if e in chosen or graph[e].op_name not in ("mm", "addmm") or refusal(graph, e) is not None:
            continue
        base, reader = operands(graph, e)[0], e
        while graph[base].op_name in ops.VIEWS and graph.users(base) == [reader]:
            base, reader = graph[base].inputs()[0], base
        inner = (readers.get(base) or [None])[-1]
        if (
            inner in chosen
            and graph.users(base) == [reader]
            and graph[inner].op_name in ("mm", "addmm")
            and graph[inner].meta.device.type == "cuda"
            and max(graph[inner].meta.shape[-1], graph[e].meta.shape[-1]) <= width
        ):
            found[e] = f"auto: chained to {inner} (widths <= {width}: one kernel)"
    return found


def fold_siblings(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], materialized: set[str]) -> None:
    """Each matmul kernel that writes nothing but its product, which only the epilogue of another
    matmul kernel of the same output shape reads (at its own element), moved into that kernel's
    `siblings` (out of `kernels` and memory): the other kernel computes its tile of that product
    too, a second accumulator and K loop (SwiGLU's `silu(x @ w1) * (x @ w3)`, LoRA's
    `x @ w + s * (x @ a) @ b`). 2-D products (mm, addmm)."""

    import networkx as nx

    graph = plan.graph
    for e, kernel in list(kernels.items()):
        if e not in kernels or graph[e].op_name not in ("mm", "addmm"):
            continue
        for store in kernel.stores:
            before = nx.ancestors(graph.dag, store)
            for other in [o for o in kernels if o != e and o in before]:
                sibling = kernels[other]
                if (
                    sibling.stores
                    or sibling.stage > kernel.stage
                    or graph[other].op_name not in ("mm", "addmm")
                    or graph[other].meta.shape != graph[e].meta.shape
                    or other in graph.outputs
                    or not at_own_element(plan, store, other, downstream_to(graph, other, store))
                    or read_elsewhere(plan, steps, {k: v for k, v in kernels.items() if k != e}, other)
                ):
                    continue
                kernel.siblings += (kernels.pop(other),)
                materialized.discard(other)


def chainable(
    plan: Plan, kernels: dict[str, MatmulKernel], kernel: MatmulKernel, base: str, reader: str, outputs: set[str]
) -> MatmulKernel | None:
    """The matmul kernel `kernel`'s operand a can be computed inside (a *chain*: `relu(x @ w1 + b1) @
    w2`), or None. It is the kernel of an earlier stage that writes `base` (its epilogue's one
    store, or its product where it has none) and nothing else, read by `reader` alone. Both are
    2-D products (mm, addmm) and the hidden width fits on chip: the inner product's columns (the
    outer's K) at most config "matmul_chain_width". A program computes its row tile of the hidden
    value once where the outer's columns fit that width too (one column tile holds them all);
    wider, each column tile computes it again, taken only where that costs at most a quarter of
    the kernel's multiply-adds (LoRA's `(x @ a) @ b` beside its sibling `x @ w`). A value a
    backward saves, a graph output or a second reader keeps its kernel: it must be written."""
    graph = plan.graph
    width = config.get("matmul_chain_width")
    inner = next((k for k in kernels.values() if k is not kernel and base in (k.stores or [k.matmul])), None)
    if inner is None or inner.stores not in ([], [base]) or inner.stage >= kernel.stage:
        return None
    if base in outputs or graph.users(base) != [reader] or inner.matmul in outputs:
        return None
    if not {graph[inner.matmul].op_name, graph[kernel.matmul].op_name} <= {"mm", "addmm"}:
        return None
    if graph[inner.matmul].meta.shape[-1] > width:
        return None
    if _recomputed(graph, kernel, inner) * 4 > _macs_in(graph, kernel, inner):
        return None
    if graph[inner.matmul].meta.device != graph[kernel.matmul].meta.device:
        return None
    # every value from the inner product to `base` is read only on the way to `base`, and the
    # operand (through its views) reads the product at its own element
    between = downstream_to(graph, inner.matmul, base)
    if any(set(graph.users(n)) - between - {reader} for n in between | {inner.matmul} if n != base):
        return None
    operand = operands(graph, kernel.matmul)[0]
    if graph[operand].meta.shape != graph[inner.matmul].meta.shape:
        return None
    if not at_own_element(plan, operand, inner.matmul, downstream_to(graph, inner.matmul, operand)):
        return None
    return inner


def _recomputed(graph: Graph, kernel: MatmulKernel, inner: MatmulKernel) -> int:
    """Multiply-adds a chain computes again: the inner kernel's once more for each column tile of
    the outer product past the first (none within config "matmul_chain_width" columns, one tile;
    else tiles of 128 columns)."""
    n = graph[kernel.matmul].meta.shape[-1]
    tiles = 1 if n <= config.get("matmul_chain_width") else -(-n // 128)
    return (tiles - 1) * sum(macs(graph, k.matmul) for k in members(inner))


def _macs_in(graph: Graph, kernel: MatmulKernel, inner: MatmulKernel) -> int:
    """Multiply-adds of a chained kernel: its own, its siblings' and the inner kernel's, once."""
    return sum(macs(graph, k.matmul) for k in members(kernel) + members(inner))
