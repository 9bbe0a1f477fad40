"""Padded matmuls: sizes that keep cuBLAS off its fast kernels are padded with zeros.

cuBLAS runs its fast (Hopper, tensor-core) kernels only when every operand's
leading dimension is a multiple of 16 bytes: 8 elements of a 16-bit dtype, 4 of
float32. GPT-2's vocabulary (50257) puts its projection and both gradients on
`align1` kernels: 10.3 of a 13.8 ms step on an H100 (issue #38). As Inductor's
pad_mm does, before planning the graph is rewritten:

    out = mm(a, b)                                 a: [M, K], b: [K, N]; K or N not a multiple of 8
 -> a_padded = constant_pad_nd(a, [0, Kp - K])     [M, Kp]: zeros in the padded columns ...
    b_padded = constant_pad_nd(b, [0, Np - N, 0, Kp - K])   ... and rows, so the products are eager's
    out_padded = mm(a_padded, b_padded)            [M, Np]
    out = slice(out_padded, 1, 0, N)               [M, N], stride (Np, 1): a view, no copy

A size is padded where it is a leading dimension cuBLAS sees: N always (the
result's rows), K where it is an operand's contiguous dim, M where `a` is
column-major (a gradient's transpose: the rows of a, then sliced off). A pad of a computed
value is one more consumer for the plan (an indexed view, lowering/ops/indexed.py):
a kernel computes the padded value from the value's own inputs, so only graph
inputs (weights) are copied as such. An operand that is a permute of a value is
padded through it (the value padded, then permuted), so two uses of one value (a
logits gradient: dh's K operand, and transposed dW's M operand) share one
padded copy. A strided slice that an ATen call or the caller would see (a graph
output, an extern's operand, a view ATen could not take of it) is copied out
once in eager's layout; kernels read it at the padded row stride, and so does a
backward that reads a saved output at any strides (dispatch/saved_layouts.py).

Ops: mm, addmm (its bias padded where it spans N or M) and bmm. When (config
"pad_matmuls"): "auto" pads a CUDA matmul of a 16-bit or float32 dtype with at
least "pad_min_macs" multiply-adds when timing both forms on this GPU says the
padded one (with its input copies) is faster (runtime/matmul_timing.py,
remembered in the tuning cache); "always" pads whenever a size is misaligned
(any device: the CPU tests); "never" keeps every matmul as written.
"""

from __future__ import annotations

import math

import torch

from minicomp import config, logs
from minicomp.ir import Graph, Node, Ref, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.indexing import contiguous_strides
from minicomp.lowering.ops import NodeKind

aten = torch.ops.aten

ALIGNMENT = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4}  # elements in 16 bytes
MATMULS = {"mm", "addmm", "bmm"}
MODES = ("auto", "always", "never")


def pad_matmuls(graph: Graph, any_layout: frozenset[str] = frozenset()) -> Graph:
    """`graph` with each matmul that qualifies padded (the same graph when none does).
    `any_layout`: outputs handed out at whatever strides the plan gives them (a forward's saved
    activations that only its backward reads: dispatch/saved_layouts.py), so a slice of a padded
    product among them stays a view."""
    mode = config.get("pad_matmuls")
    if mode not in MODES:
        raise config.ConfigError(f"pad_matmuls must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "never" or (mode == "auto" and config.get("matmul") == "template"):
        return graph  # (a template reads any size at its strides: plan/matmul.py)
    rewriter = _Rewriter(graph, mode, any_layout)
    for name in graph.order:
        rewriter.visit(graph[name])
    if not rewriter.padded:
        return graph
    return Graph(rewriter.nodes, graph.outputs, graph.mutations, graph.constants, graph.partials, graph.grouped)


class _Rewriter:
    def __init__(self, graph: Graph, mode: str, any_layout: frozenset[str]):
        self.graph, self.mode = graph, mode
        self.nodes: list[Node] = []
        self.taken = set(graph.order)
        self.made: dict[tuple, str] = {}  # (op, source, arguments) -> the node made for it: shared pads
        self.padded = 0
        self.outputs = {o for o in graph.outputs if isinstance(o, str) and o not in any_layout}
        self.restrided: dict[str, TensorMeta] = {}  # a view of a slice left strided: its strides now

    def visit(self, node: Node) -> None:
        sizes = None if node.is_input else _sizes(node, self.graph)
        pads = None if sizes is None else _pads(node, self.graph, sizes)
        if not pads or not self._pays(node, sizes, pads):
            if node.name in self.restrided:
                node = Node(node.name, node.target, node.args, dict(node.kwargs), self.restrided[node.name])
            self.nodes.append(node)
            return
        self.padded += 1
        self._rewrite(node, sizes, pads)

    # -- deciding -------------------------------------------------------------------
    def _pays(self, node: Node, sizes: tuple[int, int, int], pads: tuple[int, int, int]) -> bool:
        if self.mode == "always":
            return True
        if node.meta.device.type != "cuda" or math.prod(sizes) * _batch(node) < config.get("pad_min_macs"):
            return False
        from minicomp.runtime.matmul_timing import padding_pays

        a, b = self._operands(node)
        plain = (self._layout(a), self._layout(b))
        padded = tuple(self._padded_layout(x, p) for x, p in zip((a, b), _operand_pads(node, pads)))
        copies = [self._layout(x) for x, p in zip((a, b), _operand_pads(node, pads)) if any(p) and self._is_input(x)]
        op = "bmm" if node.op_name == "bmm" else "mm"
        pays = padding_pays(op, node.meta.dtype, node.meta.device, plain, padded, copies)
        logs.fusion.info("%s: sizes (M, K, N) %s %s", node.name, sizes, "padded" if pays else "not padded")
        return pays

    def _operands(self, node: Node) -> tuple[str, str]:
        a, b = _operand_refs(node)
        return a.name, b.name

    def _layout(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        meta = self.graph[name].meta
        return meta.shape, meta.stride

    def _padded_layout(self, name: str, pad: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(shape, stride) of `name` as `_pad` will make it: a padded value is contiguous, a
        padded permute the permute of its padded value."""
        meta = self.graph[name].meta
        if not any(pad):
            return meta.shape, meta.stride
        node = self.graph[name]
        if node.op_name == "permute":
            dims = list(node.args[1])
            shape, stride = self._padded_layout(node.args[0].name, _unpermuted(pad, dims))
            return tuple(shape[d] for d in dims), tuple(stride[d] for d in dims)
        shape = tuple(s + e for s, e in zip(meta.shape, pad))
        return shape, tuple(contiguous_strides(list(shape)))

    def _is_input(self, name: str) -> bool:
        node = self.graph[name]
        while node.op_name == "permute":
            node = self.graph[node.args[0].name]
        return node.is_input

    # -- rewriting ------------------------------------------------------------------
    def _rewrite(self, node: Node, sizes, pads) -> None:
        a, b = self._operands(node)
        pad_a, pad_b = _operand_pads(node, pads)
        args = (Ref(self._pad(a, pad_a)), Ref(self._pad(b, pad_b)))
        if node.op_name == "addmm":
            args = (Ref(self._pad_bias(node, sizes, pads)), *args)
        out, rank = node.meta, node.meta.ndim
        pad_m, _, pad_n = pads
        cuts = [(dim, extra) for dim, extra in ((rank - 2, pad_m), (rank - 1, pad_n)) if extra]
        if not cuts:  # only K grew: the product has the matmul's own shape
            self._append(node.name, node.target, args, node.kwargs, out)
            return
        shape = out.shape[:-2] + (out.shape[-2] + pad_m, out.shape[-1] + pad_n)
        padded = TensorMeta(shape, tuple(contiguous_strides(list(shape))), out.dtype, out.device)
        result = self._append(self._fresh(f"{node.name}_padded"), node.target, args, node.kwargs, padded)
        sliced = TensorMeta(out.shape, tuple(contiguous_strides(list(shape))), out.dtype, out.device)
        views: dict[str, TensorMeta] = {}
        copy_out = pad_n and not self._read_in_kernels(node.name, sliced, views)  # copied out for ATen and the caller
        if not copy_out:
            self.restrided.update(views)
        for i, (dim, _) in enumerate(cuts):
            meta = self._meta(result)
            cut = TensorMeta(
                meta.shape[:dim] + (out.shape[dim],) + meta.shape[dim + 1 :], meta.stride, out.dtype, out.device
            )
            last = i == len(cuts) - 1
            name = node.name if last and not copy_out else self._fresh(f"{node.name}_cut")
            result = self._append(name, aten.slice.Tensor, (Ref(result), dim, 0, out.shape[dim]), {}, cut)
        if copy_out:
            self._append(node.name, aten.clone.default, (Ref(result),), {}, out)

    def _read_in_kernels(self, name: str, meta: TensorMeta | None, views: dict[str, TensorMeta]) -> bool:
        """Is every use of `name` (laid out as `meta`: the padded product's slice) a kernel's read
        (through views, which a kernel reads at any strides) or an output that may come out at any
        strides (`any_layout`), never an ATen call's or the caller's, which would see the padded
        row stride? A view on the way to such an output is taken of the strided slice as torch
        takes it (its strides recorded in `views`, for the rewrite); a view torch could not take
        (`meta` None below it) may still be read by kernels, not handed to the caller."""
        if name in self.outputs or (meta is None and name in self.graph.outputs):
            return False
        for user in self.graph.users(name):
            node = self.graph[user]
            kind = ops.classify(node, self.graph)[0]
            if kind is NodeKind.EXTERN:
                return False
            if kind is NodeKind.VIEW:
                viewed = None if meta is None else _viewed(node, name, meta)
                if not self._read_in_kernels(user, viewed, views):
                    return False
                if viewed is not None and viewed.stride != node.meta.stride:
                    views[user] = viewed
        return True

    def _pad(self, name: str, pad: tuple[int, ...]) -> str:
        """`name` padded by `pad` (an amount per dim, at the end): a permute is padded through."""
        if not any(pad):
            return name
        node = self.graph[name]
        if node.op_name == "permute":
            base, dims = node.args[0].name, list(node.args[1])
            padded = self._pad(base, _unpermuted(pad, dims))
            return self._shared(
                "permute", aten.permute.default, (Ref(padded), dims), _permuted(self._meta(padded), dims)
            )
        meta = self.graph[name].meta
        flat = [x for extra in reversed(pad) for x in (0, extra)]
        shape = tuple(s + e for s, e in zip(meta.shape, pad))
        padded = TensorMeta(shape, tuple(contiguous_strides(list(shape))), meta.dtype, meta.device)
        return self._shared("padded", aten.constant_pad_nd.default, (Ref(name), flat, 0.0), padded)

    def _pad_bias(self, node: Node, sizes, pads) -> str:
        """addmm's bias, padded along the dims where it spans N (its last) or M (a 2-d bias's first)."""
        bias = node.args[0].name
        shape = self._meta(bias).shape
        pad_m, _, pad_n = pads
        m, _, n = sizes
        pad = [0] * len(shape)
        if shape and shape[-1] == n and n != 1:
            pad[-1] = pad_n
        if len(shape) == 2 and shape[0] == m and m != 1:
            pad[0] = pad_m
        return self._pad(bias, tuple(pad))

    def _shared(self, what: str, target, args: tuple, meta: TensorMeta) -> str:
        """A node made once per (op, arguments): two uses of one padded value share it."""
        key = (what, repr(args))
        if key not in self.made:
            self.made[key] = self._append(self._fresh(f"{args[0].name}_{what}"), target, args, {}, meta)
        return self.made[key]

    def _append(self, name: str, target, args: tuple, kwargs: dict, meta: TensorMeta) -> str:
        self.nodes.append(Node(name, target, args, dict(kwargs), meta))
        return name

    def _fresh(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{name}{n}"
        self.taken.add(candidate)
        return candidate

    def _meta(self, name: str) -> TensorMeta:
        for n in reversed(self.nodes):
            if n.name == name:
                return n.meta
        return self.graph[name].meta


def _viewed(node: Node, source: str, meta: TensorMeta) -> TensorMeta | None:
    """`node`'s value (a view op of `source`) where `source` is laid out as `meta`, as torch takes
    the view of such a tensor on the meta device; None where it cannot (a view that would need a
    copy) or the op takes another tensor too."""
    if node.inputs() != [source] or not isinstance(node.meta, TensorMeta):
        return None
    base = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
    args = tuple(base if isinstance(a, Ref) else a for a in node.args)
    try:
        value = node.target(*args, **node.kwargs)
    except (RuntimeError, ValueError):  # "view size is not compatible", "Cannot view a tensor"
        return None
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(node.meta.shape):
        return None
    return TensorMeta(node.meta.shape, tuple(value.stride()), node.meta.dtype, node.meta.device)


def _sizes(node: Node, graph: Graph) -> tuple[int, int, int] | None:
    """(M, K, N) of a matmul minicomp pads, else None."""
    if node.op_name not in MATMULS or not isinstance(node.meta, TensorMeta):
        return None
    refs = _operand_refs(node)
    if not all(isinstance(r, Ref) for r in refs):
        return None
    a, b = (graph[r.name].meta for r in refs)
    if not (isinstance(a, TensorMeta) and isinstance(b, TensorMeta)) or a.dtype != b.dtype:
        return None
    return a.shape[-2], a.shape[-1], b.shape[-1]


def _pads(node: Node, graph: Graph, sizes: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """How much each of (M, K, N) grows to a multiple of the dtype's alignment, or None when none
    needs to. A size counts where it is a leading dimension cuBLAS sees: N always (the result's
    rows), K where it is an operand's contiguous dim, M where `a` is column-major (a transposed
    view); a size of 1 never (a vector is no operand's leading dimension)."""
    align = ALIGNMENT.get(node.meta.dtype)
    if align is None or 0 in sizes:
        return None
    a, b = (graph[r.name].meta for r in _operand_refs(node))
    m, k, n = (0 if s == 1 or s % align == 0 else align - s % align for s in sizes)
    m = m if a.stride[-2] == 1 else 0
    k = k if a.stride[-1] == 1 or b.stride[-2] == 1 else 0
    return (m, k, n) if m or k or n else None


def _operand_refs(node: Node) -> tuple:
    return node.args[1:3] if node.op_name == "addmm" else node.args[:2]


def _operand_pads(node: Node, pads: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The padding of each operand, per dim: a [.., M, K] and b [.., K, N]."""
    pad_m, pad_k, pad_n = pads
    batch = (0,) if node.op_name == "bmm" else ()
    return batch + (pad_m, pad_k), batch + (pad_k, pad_n)


def _unpermuted(pad: tuple[int, ...], dims: list[int]) -> tuple[int, ...]:
    """The padding of a permute's input that pads the permute by `pad`."""
    base = [0] * len(dims)
    for d, extra in enumerate(pad):
        base[dims[d]] = extra
    return tuple(base)


def _batch(node: Node) -> int:
    return node.meta.shape[0] if node.op_name == "bmm" else 1


def _permuted(meta: TensorMeta, dims: list[int]) -> TensorMeta:
    return TensorMeta(tuple(meta.shape[d] for d in dims), tuple(meta.stride[d] for d in dims), meta.dtype, meta.device)
