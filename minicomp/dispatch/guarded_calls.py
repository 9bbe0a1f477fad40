"""A compiled Dynamo graph's call, kept from failing where the captured graph can run instead.

`checked_first_call`: a first call that raises (an extern's real output of another shape than its
meta kernel said, a kernel Triton cannot compile) runs the graph as Dynamo captured it, by the
fallback policy, from then on. `eager_when_reentered`: a call made while this thread interprets
another kernel (Triton's interpreter, CPU) runs the captured graph for that call alone.
`captured`: the captured graph run so, its outputs laid out as its meta says (a compiled backward
reads the saved ones so).
"""

from __future__ import annotations

import torch

from minicomp import runtime
from minicomp.dispatch import fallback, saved_layouts
from minicomp.runtime.externs import conform


def checked_first_call(compiled, gm: torch.fx.GraphModule, fail, name: str):
    """`compiled.boxed`, whose first call runs the graph as Dynamo captured it (under the fallback
    policy, and every later call too) when it fails: an extern call's real output of another shape
    than its meta kernel said (runtime/externs.py: raised before anything is written), or a kernel
    that fails to compile or launch at its first call (a Triton error). A module that writes into
    an input may have written some of it by then, so it does not run again: the error says so.
    Inputs the module may write over (`Plan.donated`, donations.py) are copied for its first call,
    so the captured graph reads them intact if it fails after such a write (the first call's peak
    is then that of a module that donates nothing). Later calls cost a Python call more."""
    boxed = compiled.boxed
    writes_inputs = bool(compiled.graph.mutations)
    donated = compiled.plan.donated
    given = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if n.name in donated]
    eager = None  # the captured graph, once a first call failed
    first = True

    def run(args):
        nonlocal eager, first
        if not first:
            return boxed(args) if eager is None else eager(args)
        first, kept = False, list(args)  # `boxed` empties the list
        for i in given:
            if isinstance(args[i], torch.Tensor):
                args[i] = _exact_copy(args[i])
        try:
            return boxed(args)
        except runtime.ExternMismatch as err:
            fail(err)
        except runtime.Reentered:  # (eager_when_reentered's: this call alone runs eagerly)
            raise
        except Exception as err:  # noqa: BLE001 - a kernel that did not compile: the captured graph instead
            if writes_inputs:
                raise fallback.CompileError(
                    f"{fallback.describe(name, err)} Its first call failed, and it writes into an input, "
                    "which it may have written already: the call is not repeated eagerly."
                ) from err
            fail(err)
        eager = captured(gm)
        return eager(kept)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def _exact_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` in a copy of its whole storage, at its offset and strides (a module that takes a donated
    value's memory may write all of it: a padded product's padding too)."""
    copy = torch.empty(0, dtype=t.dtype, device=t.device)
    return copy.set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())


def eager_when_reentered(boxed, compiled, gm: torch.fx.GraphModule):
    """`boxed`, which runs the graph as Dynamo captured it when it is called (from a signal handler,
    a GC callback, a `__del__`) while this thread interprets another kernel (runtime.Reentered,
    raised before anything is written). Only a module of Triton's interpreter (CPU) is wrapped."""
    if not compiled.interpret:
        return boxed
    eager = captured(gm)

    def run(args):
        kept = list(args)  # `boxed` empties the list
        try:
            return boxed(args)
        except runtime.Reentered:
            return eager(kept)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def captured(gm: torch.fx.GraphModule):
    """A boxed call of `gm` as captured, each saved value for the backward (a training forward's:
    saved_layouts.saved) whose real strides differ from its traced meta's (an op, a custom one,
    whose real output is laid out unlike its fake kernel's) copied into the traced layout: the
    compiled backward reads it at those strides (runtime/externs.py conforms a compiled call's
    extern outputs alike). The caller's outputs stay as the ops made them (a copy would part two
    outputs that share memory)."""
    output = next(reversed(gm.graph.find_nodes(op="output")))
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    saved = saved_layouts.saved(gm)
    layouts = [
        (i, *_layout(node))
        for i, node in enumerate(results)
        if isinstance(node, torch.fx.Node) and node.name in saved and _layout(node) is not None
    ]

    def run(args):
        values = gm.forward(*args)
        args.clear()
        if not layouts:
            return values
        found = list(values) if isinstance(values, (list, tuple)) else [values]
        for i, shape, stride in layouts:
            if isinstance(found[i], torch.Tensor) and found[i].stride() != stride:
                try:
                    found[i] = conform(found[i], shape, stride, "a captured graph's output")
                except runtime.ExternMismatch:  # (a layout that cannot hold it: left as it came)
                    pass
        return type(values)(found) if isinstance(values, (list, tuple)) else found[0]

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def _layout(node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, stride) of a node's traced tensor value, where both are plain integers."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    shape, stride = tuple(value.shape), tuple(value.stride())
    if not all(type(n) is int for n in (*shape, *stride)):
        return None
    return shape, stride
