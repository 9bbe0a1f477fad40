"""What one signature of a jitted function runs: its compiled module, or the function as written.

`JitFunction` (function.py) keeps one per signature key; autograd.py's `TrainingEntry` is the
entry of a signature whose inputs need gradients.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree

from minicomp import capture, guards, logs, runtime

if TYPE_CHECKING:
    from minicomp.pipeline import Compiled


class Entry:
    """What one signature compiled to: the generated module's `call`, which arguments go in,
    which inputs it writes into, and how the outputs come out (capture.Outputs).

    `compiled` (graph, plan, source) is there when this process traced the
    function; an entry loaded from the persistent cache has only the module.
    """

    def __init__(
        self,
        call,
        tensor_slots: list[int],
        n_leaves: int,
        outputs: capture.Outputs,
        mutated: list[int],
        compiled: Compiled | None = None,
        watched: list[torch.Tensor] | None = None,
        constants: list[torch.Tensor] | None = None,
    ):
        self.call = call
        self.tensor_slots = list(tensor_slots)
        self.slots = None if self.tensor_slots == list(range(n_leaves)) else self.tensor_slots
        self.outputs = outputs
        self.unflatten = _unflattener(outputs.spec) if outputs.simple else None
        self.mutated = list(mutated)  # argument slots the module writes into
        self.compiled = compiled
        self.ran = False  # its first call returned (function.py): a later ExternMismatch runs a call eagerly
        self.watched = watched or []  # tensor constants whose requires_grad each call checks (guards.grad_watched)
        self.constants = constants or []  # tensors it closes over, which an input it writes into must not share
        self.graphed = None  # runtime/graphs.py's Graphed its calls replay through, when graphed
        self.hot = None  # hot_path.HotPath: this signature found without its key

    def __call__(self, fn, leaves, in_spec):
        if self.mutated and guards.shares_memory(leaves, self.mutated, self.tensor_slots, self.constants):
            logs.recompiles.info(
                "an input the compiled code writes into shares memory with another argument or a tensor the "
                "function closes over: this call runs eagerly"
            )
            return EagerEntry()(fn, leaves, in_spec)
        if self.watched and guards.constants_need_grad(self.watched):
            logs.recompiles.info("a tensor the function closes over now requires grad: this call runs eagerly")
            return EagerEntry()(fn, leaves, in_spec)
        try:
            outputs = self.call(*(leaves if self.slots is None else [leaves[i] for i in self.slots]))
        except runtime.ExternMismatch as err:  # raised before any input is written (mutations go last)
            if not self.ran:  # the first call: the fallback policy decides (function.py)
                raise
            logs.recompiles.info("%s: this call runs eagerly", err)
            return EagerEntry()(fn, leaves, in_spec)
        except runtime.Reentered:  # called (a signal handler, __del__) while this thread interprets a kernel
            return EagerEntry()(fn, leaves, in_spec)
        if self.unflatten is not None:
            return self.unflatten(outputs)
        return self.outputs.assemble(outputs, leaves)


class EagerEntry:
    """A signature minicomp could not compile: the function runs as written."""

    compiled = None

    def __call__(self, fn, leaves, in_spec):
        return capture.call_eagerly(fn, leaves, in_spec)


def _unflattener(out_spec):
    """outputs tuple -> the function's output structure; plain tuples and single tensors skip pytree."""
    if out_spec.is_leaf():
        return operator.itemgetter(0)
    if out_spec == pytree.tree_flatten(tuple(range(out_spec.num_leaves)))[1]:
        return tuple
    return lambda outputs: pytree.tree_unflatten(list(outputs), out_spec)
