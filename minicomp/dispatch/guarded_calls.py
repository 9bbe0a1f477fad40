"""A compiled Dynamo graph's call, kept from failing where the captured graph can run instead.

`checked_first_call`: a first call that raises (an extern's real output of another shape than its
meta kernel said, a kernel Triton cannot compile) runs the graph as Dynamo captured it, by the
fallback policy, from then on. `eager_when_reentered`: a call made while this thread interprets
another kernel (Triton's interpreter, CPU) runs the captured graph for that call alone.
"""

from __future__ import annotations

import torch
from functorch.compile import make_boxed_func

from minicomp import runtime
from minicomp.dispatch import fallback


def checked_first_call(compiled, gm: torch.fx.GraphModule, fail, name: str):
    """`compiled.boxed`, whose first call runs the graph as Dynamo captured it (under the fallback
    policy, and every later call too) when it fails: an extern call's real output of another shape
    than its meta kernel said (runtime/externs.py: raised before anything is written), or a kernel
    that fails to compile or launch at its first call (a Triton error). A module that writes into
    an input may have written some of it by then, so it does not run again: the error says so.
    Later calls cost a Python call more."""
    boxed = compiled.boxed
    writes_inputs = bool(compiled.graph.mutations)
    eager = None  # the captured graph, once a first call failed
    first = True

    def run(args):
        nonlocal eager, first
        if not first:
            return boxed(args) if eager is None else eager(args)
        first, kept = False, list(args)  # `boxed` empties the list
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
        eager = make_boxed_func(gm.forward)
        return eager(kept)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run


def eager_when_reentered(boxed, compiled, gm: torch.fx.GraphModule):
    """`boxed`, which runs the graph as Dynamo captured it when it is called (from a signal handler,
    a GC callback, a `__del__`) while this thread interprets another kernel (runtime.Reentered,
    raised before anything is written). Only a module of Triton's interpreter (CPU) is wrapped."""
    if not compiled.interpret:
        return boxed

    def run(args):
        kept = list(args)  # `boxed` empties the list
        try:
            return boxed(args)
        except runtime.Reentered:
            return gm.forward(*kept)

    run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return run
