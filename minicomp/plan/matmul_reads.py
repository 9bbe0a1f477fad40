"""What a matmul template reads, and who reads its product.

A matmul node's operands, scales and multiply-adds, and whether the template can run it
(`refusal`). Whether a value reads a product only at the product's own element: the lowering's
index rules run backwards from the value (`at_own_element`). That decides what a template's
epilogue is (plan/matmul.py), and which operand is a chain and which product a sibling
(plan/matmul_folding.py). Whether anything outside a kernel reads a product (`read_elsewhere`),
and the kernels a template computes too (`members`, `folded`).
"""

from __future__ import annotations

import math

import torch

from minicomp.ir import Graph, Ref, TensorMeta
from minicomp.lowering.indexing import Expr, FloorDiv, IterationSpace, Mod
from minicomp.lowering.ops import NodeKind, bind
from minicomp.lowering.ops.core import broadcast_index
from minicomp.lowering.ops.views import reshape_index
from minicomp.plan.steps import Kernel, MatmulKernel, Plan, PointwiseKernel

MATMULS = {"mm", "addmm", "bmm"}


DTYPES = (torch.float16, torch.bfloat16, torch.float32)


SAME_INDEX = {"alias", "clone", "contiguous", "lift_fresh_copy"}  # views that pass the index through


RESHAPES = {"view", "reshape", "squeeze", "unsqueeze"}  # views that regroup it (reshape_index)


def operands(graph: Graph, name: str) -> tuple[str, str, str | None]:
    """(a, b, the bias addmm adds or None) of matmul `name`."""
    node = graph[name]
    args = node.args[1:3] if node.op_name == "addmm" else node.args[:2]
    bias = node.args[0].name if node.op_name == "addmm" else None
    return args[0].name, args[1].name, bias


def scales(graph: Graph, name: str) -> tuple[float, float]:
    """(alpha, beta) of an addmm (alpha * a @ b + beta * bias); (1, 0) otherwise."""
    node = graph[name]
    if node.op_name != "addmm":
        return 1, 0
    args = bind(node)
    return args.get("alpha", 1), args.get("beta", 1)


def refusal(graph: Graph, name: str) -> str | None:
    """Why the template cannot run matmul `name` (None: it can)."""
    node = graph[name]
    meta = node.meta
    refs = node.args[:3] if node.op_name == "addmm" else node.args[:2]
    if not isinstance(meta, TensorMeta) or not all(isinstance(r, Ref) for r in refs):
        return "its operands are not all tensors"
    metas = [graph[r.name].meta for r in refs]
    if not all(isinstance(m, TensorMeta) and m.dtype == meta.dtype and m.device == meta.device for m in metas):
        return "its operands differ in dtype or device"
    if meta.dtype not in DTYPES:
        return f"the template computes {', '.join(map(str, DTYPES))}, not {meta.dtype}"
    if meta.device.type not in ("cuda", "cpu"):
        return f"the template runs on CUDA and the CPU (interpreter), not {meta.device.type}"
    if 0 in meta.shape or graph[refs[-1].name].meta.shape[-2] == 0:
        return "it is empty"
    alpha, beta = scales(graph, name)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
        return "its alpha or beta is not a number"
    return None


def macs(graph: Graph, name: str) -> int:
    """Multiply-adds of matmul `name`."""
    a, b, _ = operands(graph, name)
    return math.prod(graph[name].meta.shape) * graph[a].meta.shape[-1]


def members(kernel: MatmulKernel) -> list[MatmulKernel]:
    """`kernel` and the kernels it computes too: those of its prologue (a chain's inner layers)
    and its siblings, and theirs."""
    found = [kernel]
    for inner in kernel.chained + kernel.siblings:
        found += members(inner)
    return found


def folded(kernel: MatmulKernel) -> list[tuple[MatmulKernel, str]]:
    """The kernels `kernel` computes too, each with how: "chained" (where it reads an operand a)
    or "sibling" (where its epilogue reads the product)."""
    found = []
    for inner, how in [(k, "chained") for k in kernel.chained] + [(k, "sibling") for k in kernel.siblings]:
        found += [(inner, how)] + folded(inner)
    return found


def epilogue_nodes(graph: Graph, kernel: MatmulKernel) -> list[str]:
    """The nodes a matmul kernel computes from its product (not those of its prologue)."""

    import networkx as nx

    after = nx.descendants(graph.dag, kernel.matmul)
    return [n for n in kernel.nodes if n in after]


def read_elsewhere(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], e: str) -> bool:
    """Whether something other than matmul `e`'s own kernel reads its product: a graph output, a
    mutation, an ATen call, another kernel (a later matmul's epilogue, a reduction)."""
    graph = plan.graph
    if e in graph.outputs or any(e in pair for pair in graph.mutations):
        return True
    if any(plan.kinds[user] is NodeKind.EXTERN for user in graph.users(e)):  # (a template's operand too)
        return True
    for step in steps:
        if isinstance(step, Kernel) and e in _reads(plan, step):
            return True
    return any(other != e and e in _epilogue_reads(plan, k) for other, k in kernels.items())


def _reads(plan: Plan, kernel: Kernel) -> set[str]:
    """What a kernel left after the split will read: the loads of its remaining stores."""
    graph = plan.graph
    found, seen, stack = set(), set(), list(kernel.stores)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in kernel.loads:
            found.add(name)
            continue
        stack += graph[name].inputs()
    return found


def _epilogue_reads(plan: Plan, kernel: MatmulKernel) -> set[str]:
    """The matmuls (other than its own) that a matmul kernel's epilogue reads."""
    graph = plan.graph
    found, seen, stack = set(), set(), [s for s in kernel.stores if s != kernel.matmul]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if graph[name].op_name in MATMULS and name != kernel.matmul:
            found.add(name)
            continue
        if plan.kinds[name].computed:
            stack += graph[name].inputs()
    return found


def epilogues(plan: Plan, externs: list[str]) -> dict[str, list[str]]:
    """Store -> the matmuls of its stage it reads (in graph order), for the stores of pointwise
    kernels that read the last of them only at its own element (`at_own_element`)."""
    found: dict[str, list[str]] = {}
    for kernel in plan.kernels:
        if not isinstance(kernel, PointwiseKernel):
            continue
        mine = [e for e in externs if e in kernel.loads and plan.stage_of[e] == kernel.stage]
        after = {e: downstream(plan, kernel, e) for e in mine}
        for store in kernel.stores:
            reads = [e for e in mine if store in after[e]]
            if reads and at_own_element(plan, store, reads[-1], after[reads[-1]]):
                found[store] = reads
    return found


def downstream(plan: Plan, kernel: Kernel, e: str) -> set[str]:
    """The nodes `kernel` computes from the product `e`."""
    inside, found, stack = set(kernel.nodes), set(), [e]
    while stack:
        for user in plan.graph.users(stack.pop()):
            if user in inside and user not in found:
                found.add(user)
                stack.append(user)
    return found


def downstream_to(graph: Graph, start: str, end: str) -> set[str]:
    """The nodes on paths from `start` to `end` (with `end`, without `start`)."""

    import networkx as nx

    return (nx.descendants(graph.dag, start) & nx.ancestors(graph.dag, end)) | {end}


def at_product(index: tuple[Expr, ...], root: tuple[Expr, ...]) -> bool:
    """Whether the product read at `index` is read at the tile's element `root`: equal once each
    `c*d*(E // d) + c*(E % d)` a reshape there and back leaves is written `c*E` again
    (nn.Linear on [B, S, K]: the [B*S, N] product viewed as [B, S, N] is read at
    `5*(x0 // 5) + x0 % 5`, which is x0)."""
    return len(index) == len(root) and all(_recombined(e) == r for e, r in zip(index, root))


def _recombined(expr: Expr) -> Expr:
    terms, const = dict(expr.terms), expr.const
    while True:
        pair = next(
            (
                (atom, whole)
                for atom in terms
                if isinstance(atom, Mod)
                and terms.get(whole := FloorDiv(atom.expr, atom.divisor)) == terms[atom] * atom.divisor
            ),
            None,
        )
        if pair is None:
            return Expr._make(terms, const)
        atom, whole = pair
        coeff = terms.pop(atom)
        del terms[whole]
        merged = Expr._make(terms, const) + atom.expr * coeff
        terms, const = dict(merged.terms), merged.const


def at_own_element(plan: Plan, store: str, e: str, after: set[str]) -> bool:
    """Whether `store`, evaluated at the element of its shape that row-major order puts at the
    product's element (i, j), reads the product `e` only at (i, j), through pointwise nodes and
    reshapes of the product's size: the index rules of the lowering, run backwards from the store."""
    graph = plan.graph
    product = graph[e].meta
    space = IterationSpace(product.shape)
    root = tuple(space.var(d) for d in range(len(product.shape)))
    meta = graph[store].meta
    if not isinstance(meta, TensorMeta) or meta.numel != product.numel or meta.device != product.device:
        return False
    stack = [(store, reshape_index(root, product.shape, meta.shape))]
    seen = set()
    while stack:
        name, index = stack.pop()
        if (name, index) in seen:
            continue
        seen.add((name, index))
        if name == e:
            if not at_product(index, root):
                return False
            continue
        if name not in after:
            continue  # read from memory, or not on a path from the product: any index
        node = graph[name]
        if node.meta.numel != product.numel:
            return False
        kind = plan.kinds[name]
        if kind is NodeKind.POINTWISE:
            for i in node.inputs():
                stack.append((i, broadcast_index(index, graph[i].meta.shape)))
        elif kind in (NodeKind.VIEW, NodeKind.EXTERN) and node.op_name in SAME_INDEX:  # (a chain's ATen views)
            stack.append((node.inputs()[0], index))
        elif kind in (NodeKind.VIEW, NodeKind.EXTERN) and node.op_name in RESHAPES:
            source = node.inputs()[0]
            stack.append((source, reshape_index(index, node.meta.shape, graph[source].meta.shape)))
        else:
            return False
    return True
