"""Views the generated `call` makes without an ATen call: each one seen from the buffer it views.

An extern view op (a `view`, `permute`, `slice`, a `split` and its `getitem`s, ...) of a value laid
out as its meta says moves no data: its result is the base's memory at a shape, strides and an
offset that the op's meta kernel computes from the base's layout. So `call` makes it as

    permute_2 = reinterpret(addmm, (4, 16, 1024, 64), (3145728, 64, 3072, 1), 1024)

straight from the buffer at the root of its chain of views (`addmm` -> view -> split -> getitem
-> view -> permute here): no ATen dispatch, no check of a real output's layout, and the views in
between, read by nothing else, are never made (runtime/allocate.py `reinterpret`).

Only ops whose offset is relative to their input's own start are made so (not `as_strided`, whose
storage offset is absolute), and only where the meta kernel, run on a meta tensor of the base's
layout, gives exactly the node's meta (shape, strides) in the base's dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.codegen.meta_answers import Answers, question
from minicomp.ir import Graph, Node, Ref, TensorMeta
from minicomp.lowering.ops import NodeKind

# ATen view ops (by packet name) whose result's offset is relative to their input's start
SINGLE = {
    "view", "permute", "unsqueeze", "squeeze", "transpose", "t", "expand", "alias", "slice", "select",
    "narrow", "diagonal", "unflatten", "movedim", "_reshape_alias",
}  # fmt: skip
MULTI = {"split", "split_with_sizes", "unbind", "chunk"}  # a list of views, each taken by a getitem


@dataclass(frozen=True)
class Layout:
    """A view as `reinterpret(base, shape, stride, offset)` sees it: `offset` elements past `base`'s start."""

    base: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def splits(node: Node) -> bool:
    """Whether `node` is a multi-view op (`split`, `unbind`, ...), whose views its getitems take."""
    return _packet(node) in MULTI and node.target is not operator.getitem


def base_of(node: Node, graph: Graph) -> str | None:
    """The value a view node views: its op's first input (a getitem's: its multi-view op's)."""
    if node.target is operator.getitem:
        parent = graph[node.args[0].name] if isinstance(node.args[0], Ref) else None
        return _first_ref(parent) if parent is not None and _packet(parent) in MULTI else None
    return _first_ref(node) if _packet(node) in SINGLE else None


def layout_of(node: Node, graph: Graph, answers: Answers | None = None) -> Layout | None:
    """`node` as a view of its base laid out as the base's meta says, or None where it is not a
    view op made so or its meta kernel does not give exactly the node's meta. `answers`: the
    module's meta-kernel answers (a layer's view asked again by the next identical layer)."""
    base = base_of(node, graph)
    meta = node.meta
    if base is None or not isinstance(meta, TensorMeta) or not isinstance(graph[base].meta, TensorMeta):
        return None
    op = graph[node.args[0].name] if node.target is operator.getitem else node
    if not _views(op.target) or any(isinstance(a, Ref) for a in (*op.args[1:], *op.kwargs.values())):
        return None
    b = graph[base].meta
    if b.dtype != meta.dtype:  # (`view(dtype)`: reinterpret keeps its base's dtype)
        return None
    item = node.args[1] if node.target is operator.getitem else None
    asked = question(
        Ref(base),
        op.target,
        op.args[1:],
        op.kwargs,
        item,
        (meta.shape, meta.stride),
        meta_of=lambda name: graph[name].meta,
    )
    found = (answers or Answers()).of(asked, lambda: _meta_offset(b, meta, op.target, op.args[1:], op.kwargs, item))
    return None if found is None else Layout(base, meta.shape, meta.stride, found)


def _meta_offset(b: TensorMeta, meta: TensorMeta, target, args: tuple, kwargs: dict, item) -> int | None:
    """The storage offset of `target`'s view (its `item`-th where it returns several) of a meta
    tensor laid out as `b`, where the view is laid out exactly as `meta` says; else None."""
    probe = torch.empty_strided(b.shape, b.stride, dtype=b.dtype, device="meta")
    try:
        result = target(probe, *args, **kwargs)
        if item is not None:
            result = result[item]
    except Exception:  # noqa: BLE001 - an op the meta kernel refuses here: made by ATen, as before
        return None
    if (tuple(result.shape), tuple(result.stride()), result.dtype) != (meta.shape, meta.stride, meta.dtype):
        return None
    return result.storage_offset()


def _views(target) -> bool:
    """An ATen op whose first result is an alias of its first argument, not written."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    info = schema.returns[0].alias_info
    return info is not None and not info.is_write and schema.arguments[0].alias_info is not None


def _packet(node: Node) -> str:
    return getattr(node.target, "_opname", "") if isinstance(node.target, torch._ops.OpOverload) else ""


def _first_ref(node: Node) -> str | None:
    return node.args[0].name if node.args and isinstance(node.args[0], Ref) else None


@dataclass(frozen=True)
class Made:
    """An extern view made without ATen: its `call` line (None where it is not made at all: only
    views made from its root read it) and the buffer at the root of its chain of views."""

    line: str | None
    root: str | None


class Views:
    """Which extern views of a plan its generated `call` makes from their root buffer, as `call` is
    written step by step. `as_meta(name)`: is value `name` laid out as its meta says when `call`
    runs (module.py); `answers`: the module's meta-kernel answers."""

    def __init__(self, plan, as_meta: Callable[[str], bool], answers: Answers | None = None):
        self.graph, self.kinds, self.as_meta, self.answers = plan.graph, plan.kinds, as_meta, answers
        self.roots: dict[str, tuple[str, int]] = {}  # a view made from a buffer -> (that buffer, offset)
        self.layouts: dict[str, Layout | None] = {}  # an extern view -> its layout from its base
        graph = plan.graph
        self.kept = {o for o in graph.outputs if isinstance(o, str)} | {n for m in graph.mutations for n in m}

    def made(self, name: str) -> Made | None:
        """How extern node `name` is made without ATen, or None where it is not a view made so."""
        if splits(self.graph[name]):
            return Made(None, None) if self._unmade(name) else None
        layout = self._plannable(name)
        if layout is None:
            return None
        root, start = self.roots.get(layout.base, (layout.base, 0))
        offset = start + layout.offset
        self.roots[name] = (root, offset)
        if not self._read(name):
            return Made(None, root)
        return Made(f"{name} = reinterpret({root}, {tuple(layout.shape)}, {tuple(layout.stride)}, {offset})", root)

    def _plannable(self, name: str) -> Layout | None:
        """The layout of extern view `name` from its base, where the base is laid out as its meta says."""
        if self.kinds.get(name) is not NodeKind.EXTERN:
            return None
        if name not in self.layouts:
            self.layouts[name] = layout_of(self.graph[name], self.graph, self.answers)
        layout = self.layouts[name]
        if layout is None or not (layout.base in self.roots or self.as_meta(layout.base)):
            return None
        return layout

    def _read(self, name: str) -> bool:
        """Whether view `name` must be made: an output, or read by more than views made from its root."""
        return name in self.kept or not all(
            self._plannable(u) is not None or (splits(self.graph[u]) and self._unmade(u))
            for u in self.graph.users(name)
        )

    def _unmade(self, name: str) -> bool:
        """Whether multi-view op `name` (a `split`) is not called: its getitems are made from its root."""
        return name not in self.kept and all(self._plannable(u) is not None for u in self.graph.users(name))
