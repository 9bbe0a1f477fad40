"""Find a matmul whose large product only row reductions read, and compute it by chunks (issue #41).

The rewrite is on an ATen graph before AOTAutograd traces it (dynamo.py's backend; jit's training
path, autograd.py): a matmul `a [N, D] @ b [D, V]` (mm, addmm; a linear or `h @ W.T` with a
batch flattened into N) whose product exceeds the budget (config "chunk_budget_bytes", for it
and its gradient in the region's widest dtype) is followed through the ops that keep each row's
values to that row: pointwise ops (the lowering's table), views that keep the rows in front
(view, reshape, expand, permute, unsqueeze, squeeze, slice and select of other dims), gather
and reductions along other dims (the lowering's reductions). Values the region reads that do
not come from it (targets, a mask, a scalar, a bias) are side inputs, sliced by rows where they
have the rows, else read whole. The region ends where something else reads it: each value
read there must be small per row (at most SMALL elements: a row's loss, its logsumexp, a
gathered probability); a product read otherwise (returned, summed over rows) leaves the graph
as it is. What comes after (the mean over rows, the count of targets not ignored, a z-loss's
weight) stays in the graph, outside the chunks. The region becomes one `minicomp::chunked_rows`
call (chunked_rows.py); nothing is named for one loss formula.
"""

from __future__ import annotations

import hashlib
import math
import operator

import torch
import torch.fx

from minicomp import config, logs
from minicomp.dispatch import chunk_size, chunked_ops, chunked_rows, linear_tail  # noqa: F401 - chunked_ops: the ops registered
from minicomp.dispatch.chunked_rows import REGIONS, ROWS, SIZED, WHOLE, Region

log = logs.fusion  # MINICOMP_LOGS=fusion: what was chunked, or why not

SMALL = 8  # elements a row a region result may have
MATMULS = ("mm", "addmm")
KEEP = {"alias", "clone", "_to_copy", "detach", "lift_fresh_copy"}  # same shape, the rows unchanged


def _tables():
    from minicomp.lowering.ops import POINTWISE, REDUCERS

    return POINTWISE, REDUCERS


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


class _Finder:
    """The region of one matmul node in an ATen graph, or the reason there is none."""

    def __init__(self, gm: torch.fx.GraphModule, mm: torch.fx.Node, needs_grad: set[str]):
        self.gm, self.mm, self.needs_grad = gm, mm, needs_grad
        self.pointwise, self.reducers = _tables()
        out = _val(mm)
        self.n = out.shape[0]
        self.prefix: dict[torch.fx.Node, tuple[int, ...]] = {mm: (self.n,)}
        self.region: list[torch.fx.Node] = []
        self.tainted: set[torch.fx.Node] = set()
        self.sides: dict[torch.fx.Node, tuple[str, int]] = {}

    def find(self) -> str | None:
        """None when a region was found (self.region, .outputs, .sides), else why not."""
        in_region = {self.mm}
        for node in self.gm.graph.nodes:
            if node.op != "call_function" or node is self.mm:
                continue
            inputs = node.all_input_nodes
            if not any(i in in_region or i in self.tainted for i in inputs):
                continue
            if any(i in self.tainted for i in inputs) or not self._rowwise(node, in_region):
                self.tainted.add(node)
                continue
            in_region.add(node)
            self.region.append(node)
        self.outputs = [n for n in [self.mm, *self.region] if any(u not in in_region for u in n.users)]
        if not self.outputs or self.outputs == [self.mm]:
            return "nothing but the matmul reads its product"
        for node in self.outputs:
            per_row = _val(node).numel() // self.n
            if per_row > SMALL:
                return (
                    f"{node.name} ({per_row} values a row) is read outside the rows' ops ({_reader(node, in_region)})"
                )
        wanted = set(self.outputs)  # drop nodes no result depends on
        for node in reversed(self.region):
            if node in wanted:
                wanted.update(i for i in node.all_input_nodes if i in in_region)
        self.region = [n for n in self.region if n in wanted]
        self.sides = {s: r for s, r in self.sides.items() if any(s in n.all_input_nodes for n in self.region)}
        return None

    def _rowwise(self, node: torch.fx.Node, in_region: set) -> bool:
        """Whether `node` keeps each row to itself (and records its row dims and side inputs)."""
        target = node.target
        if target is copy_like:
            target = torch.ops.aten.copy.default
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return False
        val = _val(node)
        if not isinstance(val, torch.Tensor) or target._schema.is_mutable:
            return False
        name = target._opname
        src = next(i for i in node.all_input_nodes if i in in_region)
        prefix = self.prefix[src]
        k, shape = len(prefix), tuple(val.shape)
        if name in ("view", "_unsafe_view", "reshape"):
            cut = _prefix_of(shape, self.n)
            if cut is None:
                return False
            out = shape[:cut]
        elif name in self.reducers:
            dims = _dims(node, _val(src).ndim)
            if dims is None or any(d < k for d in dims):
                return False
            out = prefix
        elif name == "gather":  # (its index does not broadcast: the rows must be the index's own)
            if node.args[0] is not src or _norm(node.args[1], shape) < k or shape[:k] != prefix:
                return False
            if not self._operands(node, prefix, in_region, only=[node.args[2]]):
                return False
            out = prefix
        elif name == "permute":
            out = prefix if list(node.args[1])[:k] == list(range(k)) else None
        elif name in ("unsqueeze", "squeeze", "expand", "slice", "select") or name in KEEP:
            if name == "squeeze" and target._overloadname != "dims":  # (a chunk of one row keeps its dim)
                return False
            out = shape[:k] if shape[:k] == prefix else None
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if (
                name in ("unsqueeze", "slice", "select")
                and _norm(dim, shape if name == "unsqueeze" else _val(src).shape) < k
            ):
                return False
        elif name in self.pointwise:
            out = shape[:k] if shape[:k] == prefix else None
            if out is not None and not self._operands(node, prefix, in_region):
                return False
        else:
            return False
        if (
            out is None
            or math.prod(out) != self.n
            or any(
                i in in_region and (self.prefix[i] != prefix or _val(i).ndim != len(shape))
                for i in node.all_input_nodes
                if name in self.pointwise
            )
        ):
            return False
        self.prefix[node] = tuple(out)
        return True

    def _operands(self, node: torch.fx.Node, prefix: tuple[int, ...], in_region: set, only=None) -> bool:
        """Each tensor input from outside the region: rows (its leading dims the rows') or whole
        (broadcast over the rows); recorded in self.sides."""
        k, rank = len(prefix), _val(node).ndim
        for side in only if only is not None else node.all_input_nodes:
            if side in in_region:
                continue
            val = _val(side)
            if not isinstance(val, torch.Tensor):
                return False
            offset = rank - val.ndim
            covered = [val.shape[j - offset] for j in range(max(offset, 0), k)]
            if offset >= k or all(d == 1 for d in covered):  # read whole, its row dims (all 1) dropped
                role = (WHOLE, tuple(val.shape[max(0, val.ndim - (rank - k)) :]))
            elif offset == 0 and tuple(val.shape[:k]) == prefix:
                role = (ROWS, (self.n, *val.shape[k:]))
            else:
                return False
            if self.sides.setdefault(side, role) != role:
                return False
        return True


def _reader(node, in_region) -> str:
    users = [u for u in node.users if u not in in_region]
    return ", ".join(u.name if u.op != "output" else "returned" for u in users)


def _prefix_of(shape: tuple[int, ...], n: int) -> int | None:
    size = 1
    for i, d in enumerate(shape):
        size *= d
        if size == n:
            return i + 1
        if size > n:
            return None
    return None


def _norm(dim, shape) -> int:
    return dim % max(len(shape), 1)


def _dims(node: torch.fx.Node, ndim: int) -> list[int] | None:
    """A reduction's dims (normalized), None for all of them."""
    from minicomp.ir.graph import Node
    from minicomp.lowering.ops.core import bind

    bound = bind(Node(node.name, node.target, node.args, dict(node.kwargs), None))
    dims = bound.get("dim")
    if dims is None or dims == []:
        return None
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % max(ndim, 1) for d in dims]


def _needs_grad(gm: torch.fx.GraphModule, requires_grad: list[bool]) -> set[str]:
    flags = iter(requires_grad)
    found: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if next(flags, False):
                found.add(node.name)
        elif node.op == "call_function" and any(i.name in found for i in node.all_input_nodes):
            val = _val(node)
            if node.target not in (torch.ops.aten.detach.default,) and (
                not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex()
            ):
                found.add(node.name)
    return found


def rewrite(gm: torch.fx.GraphModule, requires_grad: list[bool]) -> torch.fx.GraphModule | None:
    """`gm` (an ATen graph whose nodes carry meta["val"]) with each chunkable region replaced by a
    `minicomp::chunked_rows` call, or None when it has none."""
    budget = config.get("chunk_budget_bytes")
    if not budget:
        return None
    needs_grad = _needs_grad(gm, requires_grad)
    if any(n.op == "call_function" and n.target is torch.ops.aten.copy_.default for n in gm.graph.nodes):
        return None  # writes into an input: AOTAutograd traces the function itself
    changed = False
    for mm in list(gm.graph.nodes):
        if not is_large_matmul(mm, budget):
            continue
        finder = _Finder(gm, mm, needs_grad)
        why = finder.find()
        if why:
            log.info("%s: not chunked: %s", mm.name, why)
            continue
        rows = chunk_size.rows_a_chunk([finder.mm, *finder.region], finder.n, budget)
        changed = _replace(gm, finder, rows, budget) or changed
    if not changed:
        return None
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


def is_large_matmul(node, budget: int) -> bool:
    if node.op != "call_function" or getattr(node.target, "_opname", None) not in MATMULS:
        return False
    if node.target._opname == "addmm":
        bias = _val(node.args[0])
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return False
        out = _val(node)
        if not isinstance(bias, torch.Tensor) or bias.ndim not in (1, 2) or bias.shape[-1] != out.shape[-1]:
            return False  # a bias broadcast over the columns (its gradient a sum over them too)
        if bias.ndim == 2 and bias.shape[0] != 1:
            return False  # a bias with rows of its own
    val = _val(node)
    return isinstance(val, torch.Tensor) and val.ndim == 2 and 2 * val.numel() * val.dtype.itemsize > budget


def _replace(gm: torch.fx.GraphModule, finder: _Finder, rows: int, budget: int) -> bool:
    mm = finder.mm
    bias = mm.target._opname == "addmm"
    matmul_inputs = list(mm.args[:3] if bias else mm.args[:2])
    if bias:
        matmul_inputs = [matmul_inputs[1], matmul_inputs[2], matmul_inputs[0]]
    sides = list(finder.sides)
    inputs = matmul_inputs + sides
    region = set(finder.region)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first_reader = min((u for n in finder.outputs for u in n.users if u not in region), key=order.get)
    template = torch.fx.GraphModule(gm, torch.fx.Graph())
    graph = template.graph
    env = {mm: graph.placeholder("logits")}
    for side in sides:
        env[side] = graph.placeholder(side.name)
    for node in finder.region:
        copied = graph.node_copy(node, lambda n: env[n])
        k = len(finder.prefix[node])
        if getattr(node.target, "_opname", None) in SIZED:
            copied.meta["row_rest"] = tuple(_val(node).shape[k:])
        elif k > 1:
            _flatten_dims(copied, node, k)
        env[node] = copied
    graph.output([env[n] for n in finder.outputs])
    for node in graph.nodes:  # (fake values do not copy: the chunks' bodies are copies of this graph)
        node.meta = {k: v for k, v in node.meta.items() if k == "row_rest"}
    template.recompile()
    diff = [i for i, n in enumerate(inputs) if isinstance(n, torch.fx.Node) and n.name in finder.needs_grad]
    outputs = [
        (tuple(_val(n).shape), _val(n).dtype, tuple(_val(n).shape[len(finder.prefix[n]) :])) for n in finder.outputs
    ]
    side_roles = [finder.sides[s] for s in sides]
    tail = linear_tail.find(gm, finder.outputs) if diff else "no gradient is wanted"
    if isinstance(tail, str) and rows >= finder.n:  # one chunk, its product made again for the backward
        log.info("%s: not chunked: its product fits the budget, its gradients not in the forward: %s", mm.name, tail)
        return False
    if isinstance(tail, str):
        log.info("%s: its gradients in the backward: %s", mm.name, tail)
        tail = None
    late = _late_ancestors(
        [n for n in inputs + (tail.inputs if tail else []) if isinstance(n, torch.fx.Node)], order, order[first_reader]
    )
    tail_module = tail.module(gm, finder.outputs) if tail else None
    settings = config.current()  # (torch.compile's options: in force where the chunks run, pad and compile)
    key = hashlib.sha256(
        repr(
            (
                template.code,
                [(tuple(_val(n).shape), _val(n).dtype) for n in inputs],
                side_roles,
                outputs,
                diff,
                rows,
                budget,
                sorted(settings.items()),
                finder.n,
                tail_module.code if tail_module else None,
            )
        ).encode()
    ).hexdigest()[:16]
    found = Region(template, finder.n, rows, bias, side_roles, outputs, diff, budget, tail_module, settings)
    REGIONS.setdefault(key, found)
    for node in late:  # side inputs computed after a result is first read (none of them reads the region)
        first_reader.prepend(node)
    with gm.graph.inserting_before(first_reader):
        call = (
            gm.graph.call_function(torch.ops.minicomp.chunked_rows_early.default, ([*inputs], [*tail.inputs], key))
            if tail
            else gm.graph.call_function(torch.ops.minicomp.chunked_rows.default, ([*inputs], key))
        )
        for i, node in enumerate(finder.outputs):
            item = gm.graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = _val(node)
            node.replace_all_uses_with(item, delete_user_cb=lambda u, item=item: u is not item and u not in region)
    log.info(
        "%s: %d rows a chunk of %d (%d results; gradients %s)",
        *(mm.name, rows, finder.n, len(finder.outputs), "in the forward" if tail else "in the backward"),
    )
    return True


def _flatten_dims(copied: torch.fx.Node, node: torch.fx.Node, k: int) -> None:
    """The dim arguments of `copied` for its value with the k row dims flattened into one."""
    if not isinstance(node.target, torch._ops.OpOverload):  # (copy_like: no dims)
        return
    schema = node.target._schema
    rank = _val(node).ndim if node.target._opname == "unsqueeze" else _val(node.args[0]).ndim
    args, kwargs = list(copied.args), dict(copied.kwargs)
    for position, arg in enumerate(schema.arguments):
        if arg.name not in ("dim", "dims"):
            continue
        value = args[position] if position < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if value is None:
            continue
        shifted = (
            [0, *(d % rank - (k - 1) for d in value[k:])]
            if node.target._opname == "permute"
            else [d % rank - (k - 1) for d in value]
            if isinstance(value, (list, tuple))
            else value % rank - (k - 1)
        )
        if position < len(args) and not arg.kwarg_only:
            args[position] = shifted
        else:
            kwargs[arg.name] = shifted
    copied.args, copied.kwargs = tuple(args), kwargs


def _late_ancestors(nodes: list[torch.fx.Node], order: dict, limit: int) -> list[torch.fx.Node]:
    """`nodes` and what they are computed from, of those after position `limit`, in graph order."""
    found, stack = set(), [n for n in nodes if order[n] > limit]
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(i for i in node.all_input_nodes if order[i] > limit)
    return sorted(found, key=order.get)


def copy_like(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """`aten.copy(self, src)`: src broadcast to self's shape in self's dtype, differentiable."""
    return src.to(self.dtype).expand_as(self).clone()
