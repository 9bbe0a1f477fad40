"""Split reductions: one with few rows and a long reduced extent becomes two.

A bias gradient's sum(0) over [32768, 4096] has 4096 rows of 32768 elements;
the sum of a whole tensor has one row of all of them. A reduction kernel
takes a tile of rows a program (reduction_space.reduction_form, tiles.rows_per_program),
so such a reduction keeps a few SMs busy and leaves the rest idle. Before
planning, the graph is rewritten, as Inductor does:

    out = sum(x, [0])                              x: [32768, 4096] bfloat16
 -> chunks = view(x, [64, 512, 4096])              its outermost reduced dim cut in K = 64
    partial = sum(chunks, [1], dtype=float32)      [64, 4096]: K partial results a row
    out = sum(partial, [0]).to(bfloat16)           [4096]: the partials combined

The first kernel ("split 64 ways" in the plan and its header) has K times the
row tiles; the second is small and takes the reduction's consumers (a mean's
divide, a downcast, a norm's normalize) by the plan's usual rules. Partials
are held in the reduction's accumulation dtype (float32 for 16-bit floats,
int64 for integer sums), so the result is eager's up to summation order.

When (config): the reduction has fewer than "split_below" row tiles (a tile:
the rows one program takes, reduction_space.row_tiles; 256 is about two per SM
of an H100 or H200, so a norm over 2048 rows is never split), it reads at
least "split_min_numel" elements or a program would walk at least
"split_tile_numel" (DLRM's bias gradient over [8192, 64], 2 programs of 32
columns: 650 us unsplit on an H200), and K = min(extent // "split_chunk",
"split_programs" / row tiles) is at least 2. The cut dim is the reduced dim
outermost in memory (largest stride), so each partial reads a contiguous
block when the reduced dims are (a mean over [2048, 4096] cut along the 4096
would make every partial a strided column); K is at most its size, and the
largest divisor of it in [K/2, K], else the dim is padded with the combine's
identity (0 for a sum, -inf for a max) to a multiple of K.

A reduced dim too short for K on its own (a channels_last batch norm's statistics over
[64, 64, 56, 56]: N gives 64 partials, 64 programs on a 132-SM GPU, 2.5x Inductor's
time) is cut together with the reduced dims that follow it in memory (N and H:
strides H*W*C and W*C), brought to the front by a permute where they are not:

    partial = sum(view(permute(x, [0, 2, 1, 3]), [896, 4, 64, 56]), [1, 3])   [896, 64]

Partials that outnumber the rows are stored K innermost ([896, 64] at strides
(1, 896)): the combine then sums each row's partials as one contiguous run, a
program per few rows, instead of one program walking all 896 rows of 64 columns.

Split: sum, mean, amax, amin, any, all. Not split: prod (its partials would
round in the output dtype) and argmax/argmin (a position must travel with each
partial); they run one tile of rows a program.

Row groups (a norm's backward). A reduction over the leading dims of a value
that a row kernel also reads (one whose rows are those dims and whose reduced
dims, the rest, it holds whole: a persistent reduction over the same source
shape), or shaped like a value the graph returns (a bias gradient beside the
input gradient it sums), is split into the row groups of that kernel instead,
whatever its tiles:

    dw = sum(dy * x_hat, [0])                      dy, x_hat: [32768, 4096]
    dx = ... sum(dy * w * x_hat, [1]) ...          the row kernel, one row in registers
 -> partial = sum(view(dy * x_hat, [256, 128, 4096]), [1], dtype=float32)
    dw = sum(partial, [0])                         256 partial rows combined

The plan puts the partial in the row kernel (`Graph.grouped`; fusion.py): each
program takes one group of 128 rows, computes dx for them and adds their
column sums into a float32 accumulator, written as its partial row at the end
(Liger's and Inductor's "mix-order" reduction): dy and x are read once for both
gradients, and the second kernel reads 256 rows, not 32768. The groups: about
config "group_programs" of them, each of at least "group_min_rows" rows, their
size a divisor of the row count (no grouping when none lies within 2x of the
target; the reduction is then split or not by the rule above).
"""

from __future__ import annotations

import math

import torch

from minicomp import config
from minicomp.ir import Graph, Node, Ref, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.indexing import contiguous_strides
from minicomp.lowering.ops import NodeKind
from minicomp.lowering.ops.reductions import spec
from minicomp.plan.reduction_space import ReductionSpace, can_take_row_groups, reduction_form, row_itemsize, row_tiles

aten = torch.ops.aten

# reduction -> (the op that computes partials and combines them, whether it takes an accumulation dtype)
SPLITTABLE = {
    "sum": (aten.sum.dim_IntList, True),
    "mean": (aten.sum.dim_IntList, True),
    "amax": (aten.amax.default, False),
    "amin": (aten.amin.default, False),
    "any": (aten.any.dims, False),
    "all": (aten.all.dims, False),
}


def split_reductions(graph: Graph) -> Graph:
    """`graph` with every reduction that qualifies split in two (the same graph when none does)."""
    nodes: list[Node] = []
    partials, grouped = dict(graph.partials), dict(graph.grouped)
    taken = set(graph.order)
    row_kernels = _row_kernels(graph)
    for name in graph.order:
        node = graph[name]
        lead, cut = 0, None
        if (group := _group_cut(node, graph, row_kernels)) is not None:
            lead, cut = group
        else:
            cut = _cut(node, graph)
        if cut is None:
            nodes.append(node)
            continue
        made, partial, k = _rewrite(node, graph, *cut, taken, lead)
        nodes += made
        partials[partial] = (name, k)
        if lead:
            grouped[partial] = lead
    if len(partials) == len(graph.partials):
        return graph
    return Graph(nodes, graph.outputs, graph.mutations, graph.constants, partials, grouped)


def _row_kernels(graph: Graph) -> tuple[dict[ReductionSpace, list[str]], dict[tuple, list[str]]]:
    """What a row-group partial can ride in: the row reductions (rows leading, reduced dims
    trailing) short enough to hold their rows whole, by space (a kernel taking row groups is
    held whole: fusion.py); and the computed values the graph returns (a gradient
    written beside the column sums of its bias, `fusion._row_group_kernel`), by (shape, device)."""
    rows: dict[ReductionSpace, list[str]] = {}
    returned: dict[tuple, list[str]] = {}
    outputs = {o for o in graph.outputs if isinstance(o, str)}
    for name in graph.order:
        node = graph[name]
        if node.is_input:
            continue
        kind = ops.classify(node, graph)[0]
        if name in outputs and kind.fusible:
            returned.setdefault((node.meta.shape, node.meta.device), []).append(name)
        if kind is not NodeKind.REDUCTION:
            continue
        r = spec(node, graph)
        src = graph[r.source].meta
        space = ReductionSpace(src.shape, r.dims, src.device)
        if r.dims == tuple(range(src.ndim - len(r.dims), src.ndim)) and can_take_row_groups(space, src.stride):
            rows.setdefault(space, []).append(name)
    return rows, returned


def _group_cut(node: Node, graph: Graph, row_kernels) -> tuple[int, tuple[tuple[int, ...], int, int]] | None:
    """(leading dims that are rows, (those dims, groups, rows)) when `node` reduces the leading dims of a
    value that a row kernel (`_row_kernels`) also walks: a persistent row reduction over the other
    dims, or a returned value of its shape; one that does not need `node`'s result (that one could
    only run after it). Else None."""
    if not _splittable(node, graph):
        return None
    r = spec(node, graph)
    src = graph[r.source].meta
    lead = len(r.dims)
    if not 0 < lead < src.ndim or r.dims != tuple(range(lead)):
        return None
    rows, returned = row_kernels
    space = ReductionSpace(src.shape, tuple(range(lead, src.ndim)), src.device)
    takers = rows.get(space, [])
    if can_take_row_groups(space, src.stride):  # a value of the same shape the call returns can take them too
        takers = takers + returned.get((src.shape, src.device), [])
    import networkx as nx  # only here (and in explain): a compile with no such reduction never loads it

    after = nx.descendants(graph.dag, node.name)
    if all(b in after for b in takers):  # no row kernel to ride in: each needs this result first
        return None
    if any(src.stride[d] != src.stride[d + 1] * src.shape[d + 1] for d in range(lead - 1)):
        return None  # the rows are not one run of memory: no view merges them
    rows = math.prod(src.shape[:lead])
    target = max(config.get("group_min_rows"), -(-rows // config.get("group_programs")))
    group = next((g for g in range(min(target, rows), min(2 * target, rows) + 1) if rows % g == 0), None)
    if group is None:
        return None
    return lead, (tuple(range(lead)), rows // group, rows)


def _splittable(node: Node, graph: Graph) -> bool:
    """Is `node` a reduction that a kernel computes, of an op with a split form (`SPLITTABLE`)?"""
    return not node.is_input and node.op_name in SPLITTABLE and ops.classify(node, graph)[0] is NodeKind.REDUCTION


def _cut(node: Node, graph: Graph) -> tuple[tuple[int, ...], int, int] | None:
    """(the dims cut as one, K, their size after padding) when `node` is split, else None."""
    if not _splittable(node, graph):
        return None
    r = spec(node, graph)
    src = graph[r.source].meta
    space = ReductionSpace(src.shape, r.dims, src.device)
    _, rblock, _ = reduction_form(space, src.stride, row_itemsize(graph, r.source))
    tiles = row_tiles(space, rblock)
    numel = space.rows * space.extent
    if tiles >= config.get("split_below"):
        return None
    if numel < config.get("split_min_numel") and numel < tiles * config.get("split_tile_numel"):
        return None
    target = config.get("split_programs")
    sized = [d for d in r.dims if src.shape[d] > 1] or list(r.dims)
    dim = max(sized, key=lambda d: (abs(src.stride[d]), src.shape[d], -d))  # outermost in memory
    wanted = min(space.extent // config.get("split_chunk"), -(-target // tiles))
    run = _memory_run(dim, sized, src, wanted)
    if len(run) > 1:  # the dims cut as one (a channels_last batch norm's N, H, W): K by a divisor
        size = math.prod(src.shape[d] for d in run)
        k = min(wanted, size)
        for c in range(k, max(1, k // 2) - 1, -1):
            if size % c == 0 and c >= 2:
                return run, c, size
    k = min(wanted, src.shape[dim])
    if k < 2:
        return None
    size = src.shape[dim]
    for c in range(k, max(1, k // 2) - 1, -1):
        if size % c == 0 and c >= 2:
            return (dim,), c, size
    return (dim,), k, -(-size // k) * k


def _memory_run(dim: int, reduced: list[int], src: TensorMeta, wanted: int) -> tuple[int, ...]:
    """`dim` and the reduced dims that follow it in memory as one run (each dim's stride the next
    one's times its size), added while their sizes multiply to fewer than half of `wanted`
    partials (K may be any divisor in [K/2, K]): the cut of a reduction whose outermost reduced
    dim alone is far too short for K (channels_last [64, 64, 56, 56] summed over N, H and W: N
    gives 64 partials, N*H 3584)."""
    run = [dim]
    while 2 * math.prod(src.shape[d] for d in run) < wanted:
        inner = src.stride[run[-1]]
        after = [d for d in reduced if d not in run and src.stride[d] * src.shape[d] == inner and src.stride[d] != 0]
        if not after:
            break
        run.append(after[0])
    return tuple(run)


def _rewrite(node: Node, graph: Graph, run: tuple[int, ...], k: int, size: int, taken: set[str], lead: int = 0):
    """(the nodes that replace `node`, the partial reduction's name, K). The last node keeps
    `node`'s name and meta, so its users and the graph's outputs read it unchanged. `run`: the
    reduced dims cut as one (`size` elements in all; one dim, or several that follow each other
    in memory, brought to the front by a permute where they are not there). With `lead`, `run`
    is the leading `lead` dims: the row groups of a row kernel."""
    r = spec(node, graph)
    src = graph[r.source].meta
    out = node.meta
    op, takes_dtype = SPLITTABLE[node.op_name]
    acc = r.acc if takes_dtype else out.dtype
    made: list[Node] = []

    def add(what: str, target, args, shape, dtype, stride=None, kwargs=None) -> str:
        name = _fresh(f"{node.name}_{what}", taken)
        meta = TensorMeta(tuple(shape), tuple(stride or contiguous_strides(list(shape))), dtype, src.device)
        made.append(Node(name, target, args, kwargs or {}, meta))
        return name

    source, shape, stride = r.source, src.shape, src.stride
    if len(run) == 1:
        dim = run[0]
        if size != shape[dim]:  # pad the cut dim with the combine's identity
            shape = shape[:dim] + (size,) + shape[dim + 1 :]
            pad = [0, 0] * (src.ndim - 1 - dim) + [0, size - src.shape[dim]]
            source = add(
                "padded", aten.constant_pad_nd.default, (Ref(source), pad, _identity(node, src.dtype)), shape, src.dtype
            )
            stride = tuple(contiguous_strides(list(shape)))
        chunk = size // k
        view_shape = shape[:dim] + (k, chunk) + shape[dim + 1 :]
        view_stride = stride[:dim] + (stride[dim] * chunk, stride[dim]) + stride[dim + 1 :]
        inner = sorted({dim + 1} | {d + 1 if d > dim else d for d in r.dims if d != dim})
        k_at = dim - sum(1 for d in r.dims if d < dim)
    else:  # [run..., rest...] -> [k, chunk, rest...]
        rest = [d for d in range(src.ndim) if d not in run]
        order = [*run, *rest]
        if order != list(range(src.ndim)):
            shape, stride = tuple(shape[d] for d in order), tuple(stride[d] for d in order)
            source = add("permuted", aten.permute.default, (Ref(source), order), shape, src.dtype, stride)
        chunk, inmost = size // k, stride[len(run) - 1]
        view_shape = (k, chunk) + shape[len(run) :]
        view_stride = (inmost * chunk, inmost) + stride[len(run) :]
        inner = [1] + [2 + i for i, d in enumerate(rest) if d in r.dims]
        k_at = 0
    chunks = add("chunks", aten.view.default, (Ref(source), list(view_shape)), view_shape, src.dtype, view_stride)
    partial_shape = [s for d, s in enumerate(view_shape) if d not in inner]
    dtype_kw = {"dtype": acc} if takes_dtype else {}
    layout = None if lead else _partial_strides(partial_shape, k_at)
    partial = add("partial", op, (Ref(chunks), inner, False), partial_shape, acc, layout, dtype_kw)
    rows_shape = [s for d, s in enumerate(src.shape) if d not in r.dims]
    steps = [("total", op, (Ref(partial), [k_at], False), rows_shape, acc, dtype_kw)]
    if r.divide != 1:  # mean
        steps.append(("mean", aten.div.Tensor, (None, r.divide), rows_shape, acc, {}))
    if acc != out.dtype:
        steps.append(("cast", aten._to_copy.default, (None,), rows_shape, out.dtype, {"dtype": out.dtype}))
    if tuple(rows_shape) != out.shape:  # keepdim
        steps.append(("kept", aten.view.default, (None, list(out.shape)), out.shape, out.dtype, {}))
    previous = partial
    for i, (what, target, args, shape_, dtype, kwargs) in enumerate(steps):
        args = tuple(Ref(previous) if a is None else a for a in args)
        if i == len(steps) - 1:
            made.append(Node(node.name, target, args, kwargs, out))
        else:
            previous = add(what, target, args, shape_, dtype, kwargs=kwargs)
    return made, partial, k


def _partial_strides(shape: list[int], k_at: int) -> tuple[int, ...] | None:
    """The partials' layout: K innermost where they are more than the rows (a channels_last batch
    norm's [896, 64]), so the combine reads each row's partials as one contiguous run (a row
    reduction, its programs over the rows) instead of walking all K rows of a column sum in one
    program; else contiguous (None; row-group partials always are)."""
    rows = math.prod(shape) // max(shape[k_at], 1)
    if rows >= shape[k_at] or rows == 1:
        return None
    strides, step = [0] * len(shape), shape[k_at]
    for d in reversed(range(len(shape))):
        if d != k_at:
            strides[d], step = step, step * shape[d]
    strides[k_at] = 1
    return tuple(strides)


def _identity(node: Node, dtype: torch.dtype):
    """The pad value a combine ignores: 0 for a sum or any, 1 for all, -inf / +inf for a max / min."""
    name = node.op_name
    if name in ("sum", "mean", "any"):
        return 0
    if name == "all":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if name == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if name == "amax" else info.max


def _fresh(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    taken.add(candidate)
    return candidate
