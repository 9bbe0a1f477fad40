"""Outputs that view an input or another output, returned as those views (as eager returns them).

A compiled module writes each output it computes into memory of its own. Where the graph's
output is a view (through view ops: `view`, `slice`, `select`, a `split`'s getitems) of

- an input, in a graph with symbolic sizes: AOTAutograd makes such an output again from the
  caller's input by `as_strided` at the compiled output's layout (`gen_alias_from_base`), and a
  fresh output at offset 0 made `x.view(s0 * 4)[1:]` come back as `x.view(-1)[:-1]`;
- another output, in an inference graph: the two came back as two memories where eager's
  share one (`y, y[1:]`: a write into one is not seen in the other).

A view of another dtype (`view(torch.int32)`) is made from the base read as that dtype.

`returning_views` wraps the compiled callable so that each such output is that view of the
caller's input or of the base output (`as_strided` at the traced shape, strides and offset),
where the base came out laid out as traced (an inference output may come out at other strides:
then it stays as computed).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

# (output position, base position, shape, strides, offset, dtype: the base read as that dtype, or None)
View = tuple[int, int, tuple, tuple, int, "torch.dtype | None"]


def input_views(gm: torch.fx.GraphModule) -> list[View]:
    """The outputs of a concrete graph that view one of its inputs through view ops whose offset is
    relative to their input (`view`, `slice`, `select`, ...; a `split`'s getitems): (output
    position, input position, shape, strides, offset past the input's own). AOTAutograd makes such
    an output again from the caller's input, by `as_strided` at the compiled output's layout where
    its views had symbolic sizes (`gen_alias_from_base`); a compiled output is fresh memory at
    offset 0, so `x.view(s0 * 4)[1:]` came back as `x.view(-1)[:-1]`. A view of the value the graph
    writes into an input (`x.mul_(2)` then the view) views that input too."""
    inputs = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    # a value written into an input in its layout (AOTAutograd's `copy_` of a mutated input): a
    # view of it is that view of the input, once the graph has run
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default):
        into, value = node.args[:2]
        if into in inputs and isinstance(value, torch.fx.Node) and _laid_out_alike(into, value):
            inputs.setdefault(value, inputs[into])
    views = []
    for position, node in enumerate(_results(gm)):
        val, base = node.meta.get("val") if isinstance(node, torch.fx.Node) else None, node
        while isinstance(base, torch.fx.Node) and base not in inputs:
            base = _viewed(base)
        found = _offset(val, base) if isinstance(base, torch.fx.Node) and base is not node else None
        if found is not None:
            views.append((position, inputs[base], tuple(val.shape), tuple(val.stride()), *found))
    return views


def _offset(val, base: torch.fx.Node) -> tuple[int, torch.dtype | None] | None:
    """(`val`'s offset past `base`'s value, in val's elements; val's dtype where it differs from
    the base's: a view(dtype), read from `base.view(dtype)`), or None where that is no view."""
    of = base.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(of, torch.Tensor):
        return None
    if val.dtype == of.dtype:
        return val.storage_offset() - of.storage_offset(), None
    start, left = divmod(of.storage_offset() * of.dtype.itemsize, val.dtype.itemsize)  # (no op on `of`)
    return (val.storage_offset() - start, val.dtype) if left == 0 else None


def _view_of(base: torch.Tensor, shape, stride, offset: int, dtype) -> torch.Tensor:
    """The view `returning_views` makes of `base` (read as `dtype` where given)."""
    if dtype is not None:
        base = base.view(dtype)
    return base.as_strided(shape, stride, base.storage_offset() + offset)


def _laid_out_alike(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    values = a.meta.get("val"), b.meta.get("val")
    return all(isinstance(v, torch.Tensor) for v in values) and len({(v.shape, v.stride()) for v in values}) == 1


def output_views(gm: torch.fx.GraphModule) -> list[tuple[View, tuple, tuple]]:
    """The outputs of a graph that view another of its outputs through view ops (`y, y[1:]`), each
    with the base output's traced shape and strides: (view, base shape, base strides)."""
    outputs = _results(gm)
    positions = {node: i for i, node in enumerate(outputs) if isinstance(node, torch.fx.Node)}
    views = []
    for position, node in enumerate(outputs):
        val, base = node.meta.get("val") if isinstance(node, torch.fx.Node) else None, _viewed(node)
        while isinstance(base, torch.fx.Node) and base not in positions:
            base = _viewed(base)
        based = isinstance(base, torch.fx.Node) and positions[base] != position
        found = _offset(val, base) if based else None
        if found is not None:
            of = base.meta["val"]
            view = (position, positions[base], tuple(val.shape), tuple(val.stride()), *found)
            views.append((view, tuple(of.shape), tuple(of.stride())))
    return views


def returning_views(boxed: Callable, gm: torch.fx.GraphModule, of_inputs: bool, of_outputs: bool) -> Callable:
    """`boxed` (a compiled `gm`) with each output that views an input (`input_views`: `of_inputs`,
    a graph of symbolic sizes) returned as that view of the caller's input, as the graph returns
    it, and each output that views another output (`output_views`: `of_outputs`, an inference
    graph) as that view of it, where that output came out laid out as traced."""
    views = input_views(gm) if of_inputs else []
    bases = output_views(gm) if of_outputs else []
    if not views and not bases:
        return boxed

    def run(args: list):
        viewed = {i: args[i] for _, i, *_ in views}  # (`boxed` empties the list)
        results = boxed(args)
        made = list(results)
        for position, i, *view in views:
            made[position] = _view_of(viewed[i], *view)
        for (position, j, *view), base_shape, base_stride in bases:
            base = made[j]
            if isinstance(base, torch.Tensor) and base.shape == base_shape and base.stride() == base_stride:
                made[position] = _view_of(base, *view)
        return type(results)(made)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def _viewed(node):
    """The node a view op's node views, or None."""
    from minicomp.codegen.view_layouts import MULTI, SINGLE

    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target is operator.getitem:
        parent = node.args[0]
        multi = isinstance(parent, torch.fx.Node) and getattr(parent.target, "_opname", "") in MULTI
        return parent.args[0] if multi else None
    return node.args[0] if getattr(node.target, "_opname", "") in SINGLE else None


def _results(gm: torch.fx.GraphModule) -> list:
    output = next(reversed(gm.graph.find_nodes(op="output")))
    return list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
