"""Saved activations handed to the backward in the layout the forward computed them in.

A value the forward saves for the backward alone is minicomp's to lay out: nobody else sees it.
Where the forward has it as a strided view (a padded matmul's product, `out_padded[:, :N]`, row
stride Np: plan/pad_matmuls.py), copying it out densely costs a read and a write of the whole value
and keeps both alive at once: GPT-2's [4096, 50257] logits, 412 MB in bf16, a step. Instead:

- `mark` (the partition, dispatch/partition.py): the forward's outputs that only the backward reads
  are recorded on the forward graph (`ANY_LAYOUT` in its meta);
- the forward's compile leaves them at the strides its plan has (`compile_graph(any_layout=...)`);
  `produced` reads which of them came out laid out unlike the traced graph's meta;
- the backward's compile (`laid_out`) gives those inputs the forward's layout in its graph's meta
  and propagates fake tensors through the graph again, so every node after them has the layout
  eager gives it from there (its views too); where the graph cannot take that layout (a view
  eager could not make of it), the traced one stays and the input is copied into it. Its callable
  conforms an input that arrives otherwise (the forward run eagerly after a fallback hands eager's
  dense value): `conformed`.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from minicomp.lowering.indexing import row_padded_strides
from minicomp.plan.pad_matmuls import ALIGNMENT
from minicomp.runtime.externs import conform

ANY_LAYOUT = "minicomp_any_layout"  # forward graph meta: saved outputs only the backward reads
SAVED = "minicomp_saved"  # forward graph meta: the outputs the backward reads (its saved activations)
RECOMPUTED = "minicomp_recomputed"  # forward graph meta: its values the backward computes again
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def mark(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule) -> None:
    """Record on `forward`'s meta the names of its saved matmul products that the backward alone
    reads (not returned to the caller as well, who sees eager's layout) and can read with a gap
    after each row (fake tensors propagated through it with such a layout: a padded product's),
    and the names of all its values the backward reads (`saved`) or computes again (`recomputed`)."""
    outputs = [a for a in _output_args(forward) if isinstance(a, torch.fx.Node)]
    once = {n.name: n for n in outputs if outputs.count(n) == 1 and n.target in _MATMULS}
    probes = {}
    for node in backward.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and node.name in once and node.users and _rows(value) and _misaligned(value):
            probes[node.name] = (tuple(value.shape), row_padded_strides(value.shape, value.shape[-1] + 1))
    names = set(probes) if probes and _propagated(backward, probes, keep=False) else set()
    forward.meta[ANY_LAYOUT] = frozenset(names)
    forward.meta[SAVED] = saved_activations(forward, backward)
    forward.meta[RECOMPUTED] = recomputed_values(forward, backward)


def any_layout(forward: torch.fx.GraphModule) -> frozenset[str]:
    return forward.meta.get(ANY_LAYOUT, frozenset())


def saved(forward: torch.fx.GraphModule) -> frozenset[str]:
    """The forward's values its backward reads, as the partition recorded them (`mark`)."""
    return forward.meta.get(SAVED, frozenset())


def recomputed(forward: torch.fx.GraphModule) -> frozenset[str]:
    """The forward's values its backward computes again, as the partition recorded them (`mark`)."""
    return forward.meta.get(RECOMPUTED, frozenset())


def recomputed_values(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule) -> frozenset[str]:
    """The forward's computed values that the backward computes again: the partition copies each
    node of the joint graph it recomputes into the backward under its name (names are unique in
    the joint graph), so a computed node of both graphs with one name is one value."""
    computed = {n.name: n.target for n in forward.graph.nodes if n.op == "call_function"}
    return frozenset(
        n.name for n in backward.graph.nodes if n.op == "call_function" and computed.get(n.name) == n.target
    )


def saved_activations(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule) -> frozenset[str]:
    """The backward's inputs that the forward computed (not its own inputs, not tangents): the
    partition names them after the forward's nodes, and AOTAutograd hands them to the boxed
    backward, which frees each at its last use; parameters and tangents stay the caller's."""
    computed = {n.name for n in forward.graph.nodes if n.op not in ("placeholder", "output")}
    return frozenset(n.name for n in backward.graph.nodes if n.op == "placeholder" and n.name in computed)


def produced(forward: torch.fx.GraphModule, compiled) -> dict[str, tuple[tuple, tuple]]:
    """{name: (shape, stride)} of the saved outputs the compiled forward lays out unlike the traced
    graph's meta (`compiled`: pipeline.Compiled)."""
    traced = {n.name: n.meta.get("val") for n in forward.graph.nodes}
    layouts = {}
    for name in any_layout(forward):
        meta, value = compiled.graph[name].meta if name in compiled.graph.nodes else None, traced.get(name)
        stride = tuple(compiled.plan.strides.get(name, meta.stride)) if meta is not None else None
        if isinstance(value, torch.Tensor) and stride is not None and stride != tuple(value.stride()):
            layouts[name] = (tuple(meta.shape), stride)
    return layouts


def laid_out(backward: torch.fx.GraphModule, layouts: dict) -> list[tuple[int, tuple, tuple]]:
    """Give `backward`'s inputs named in `layouts` those strides, and every node after them the
    layout eager would give it from there (fake tensors propagated through the graph again: a view
    of a row-padded value keeps the padded stride); the (position, shape, stride) of each such
    input, for `conformed`. Where the graph cannot take them (a view eager could not make of that
    layout), its meta stays as traced and each input is conformed to the traced layout instead."""
    placeholders = [n for n in backward.graph.nodes if n.op == "placeholder"]
    wanted = {i: layouts[n.name] for i, n in enumerate(placeholders) if n.name in layouts}
    if not wanted:
        return []
    if not _propagated(backward, layouts, keep=True):
        return [(i, shape, tuple(placeholders[i].meta["val"].stride())) for i, (shape, _) in wanted.items()]
    return [(i, shape, stride) for i, (shape, stride) in wanted.items()]


def _propagated(backward: torch.fx.GraphModule, layouts: dict, keep: bool) -> bool:
    """Whether fake tensors propagate through `backward` with its inputs named in `layouts` at those
    (shape, stride); its nodes keep the new meta where `keep` and it did, else the traced one.
    Only the nodes whose layout can change run again: those reading an input of `layouts` or a
    node whose value came out otherwise than its meta (a view of the padded logits, not the
    matmul reading them): a size of a dynamic graph pays this at each new length."""
    placeholders = [n for n in backward.graph.nodes if n.op == "placeholder"]
    if any(not isinstance(n.meta.get("val"), torch.Tensor) for n in placeholders if n.name in layouts):
        return False
    values = [n.meta.get("val") for n in placeholders]
    mode = next((v.fake_mode for v in values if getattr(v, "fake_mode", None) is not None), None)
    concrete = mode is None  # a graph made concrete for one size (capture/specialize.py): layouts, no fake tensors
    mode = FakeTensorMode() if concrete else mode
    traced = {n: dict(n.meta) for n in backward.graph.nodes}
    changed: dict[torch.fx.Node, object] = {}
    faked: dict[torch.fx.Node, object] = {}

    def value(node):  # a changed node's new value, else one laid out as its meta
        if node in changed:
            return changed[node]
        if node not in faked:
            val = node.meta.get("val")
            if val is None and node.op == "get_attr":
                val = getattr(backward, node.target)  # (a constant: allow_non_fake_inputs)
            elif concrete:
                val = torch.fx.node.map_aggregate(val, lambda v: _fake(v) if isinstance(v, torch.Tensor) else v)
            faked[node] = val
        return faked[node]

    allowed, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True  # the graph's constants
    try:
        with mode:
            for node in placeholders:
                if node.name in layouts:
                    val = node.meta["val"]
                    changed[node] = torch.empty_strided(*layouts[node.name], dtype=val.dtype, device=val.device)
            for node in backward.graph.nodes:
                if node.op != "call_function" or not any(a in changed for a in node.all_input_nodes):
                    continue
                args = torch.fx.node.map_arg(node.args, value)
                kwargs = torch.fx.node.map_arg(node.kwargs, value)
                result = node.target(*args, **kwargs)
                if not _laid_out_alike(result, node.meta.get("val")):
                    changed[node] = result
        done = True
    except Exception:  # noqa: BLE001 - a view this layout cannot take
        done = False
    finally:
        mode.allow_non_fake_inputs = allowed
    if done and keep:
        for node, val in changed.items():
            node.meta["val"] = val
    else:
        for node, meta in traced.items():
            node.meta.clear()
            node.meta.update(meta)
    return done


def _laid_out_alike(new, old) -> bool:
    """Whether two values (tensors, or tuples and lists of them) have the same shapes, strides,
    offsets, dtypes and devices (numbers: equal)."""
    if isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor):
        numbers = [(*t.shape, *t.stride(), t.storage_offset()) for t in (new, old)]
        return (
            new.dim() == old.dim()
            and all(map(_same_number, *numbers))
            and (new.dtype, new.device) == (old.dtype, old.device)
        )
    if isinstance(new, (tuple, list)) and isinstance(old, (tuple, list)):
        return len(new) == len(old) and all(_laid_out_alike(a, b) for a, b in zip(new, old))
    return not isinstance(new, torch.Tensor) and not isinstance(old, torch.Tensor) and _same_number(new, old)


def _same_number(a, b) -> bool:
    """Equal numbers; symbolic ones (a dynamic graph's sizes) by their expressions, no guard made."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        if not (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt)):
            return False
        return a.node.expr == b.node.expr
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - (values that do not compare: not alike)
        return False


def _fake(value: torch.Tensor) -> torch.Tensor:
    """A fake tensor (under the current fake mode) of `value`'s shape, strides, offset, dtype and device."""
    shape, stride = tuple(value.shape), tuple(value.stride())
    span = value.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    base = torch.empty(span if all(shape) else value.storage_offset(), dtype=value.dtype, device=value.device)
    return base.as_strided(shape, stride, value.storage_offset())


def conformed(boxed, checks: list[tuple[int, tuple, tuple]]):
    """`boxed` (a boxed backward), each input of `checks` first made to have its planned strides (a
    copy, only when it arrives laid out otherwise)."""
    if not checks:
        return boxed

    def run(args):
        for i, shape, stride in checks:  # (no local keeps an input: `boxed` frees each at its last use)
            if isinstance(args[i], torch.Tensor) and args[i].stride() != stride:
                args[i] = conform(args[i], shape, stride, "a saved activation")
        return boxed(args)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def _output_args(gm: torch.fx.GraphModule) -> list:
    node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    args = node.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def _rows(value) -> bool:
    """A tensor of at least 2 dims laid out contiguously (as a matmul's product is)."""
    return isinstance(value, torch.Tensor) and value.ndim >= 2 and value.is_contiguous() and value.numel() > 0


def _misaligned(value: torch.Tensor) -> bool:
    """Would pad_matmuls pad this product's columns (its row length not a multiple of 16 bytes)?
    Only such a product can come out of the forward as a slice: the others are not probed (a
    backward's fake propagation is a first call's cost)."""
    alignment = ALIGNMENT.get(value.dtype)
    return alignment is not None and value.shape[-1] % alignment != 0
