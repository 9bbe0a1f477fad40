"""A jitted function's last signature, found without its key (issue #39: a call's host time).

A call's key (function.py `_key`) holds each tensor's shape, strides, dtype, device and
requires_grad, each other argument's value and the global modes: building and hashing it is most of
a small call's own time (2.7 of 8.7 µs for a graphed call of two tensors on the CPU machine). A loop
calls a function with arguments like the last call's (a decoding step, a training step), so the
signature that last ran is checked first, in one C++ call: torch's `TensorGuards` (what Dynamo's
tensor guards were built on) compares each tensor's Python type, dispatch keys (CPU or CUDA,
negative and conjugate views, inference tensors, autograd), dtype, device, requires_grad, sizes and
strides with the call it was made from. The other arguments' keys, the global modes and the values
the function reads are compared as the key compares them. Anything else goes the keyed way (which
makes its own signature the hot one): keyword arguments, containers among the arguments, another
count, a tensor of another type (a Parameter where a tensor was), a change.

So a hit of the hot path is a hit of the key: every field the key holds is compared, and the checks
are stricter where they differ. A graphed signature (runtime/graphs.py) also skips the layers
between the entry and its record: the hot path checks the record's input addresses and replays it,
and falls back to the keyed way for whatever needs the Graphed's bookkeeping (an input at another
address, a record dropped or recorded again). Each hot path is written out as one Python function
for its signature (hot_source.py).
"""

from __future__ import annotations

import weakref

import torch

from minicomp import logs
from minicomp.dispatch.entries import Entry
from minicomp.dispatch.hot_source import MISS, written

try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # (a torch without Dynamo's C++ guards: every call takes the keyed way)
    TensorGuards = None

__all__ = ["MISS", "HotPath", "hot_path"]


class HotPath:
    """One signature's entry, served when a call's arguments match it (see the module docstring)."""

    __slots__ = (
        "fn",
        "count",
        "tensors",
        "check",
        "others",
        "modes",
        "context",
        "entry",
        "graphed",
        "record",
        "call",
        "source",
        "code",
    )

    def __init__(self, fn, key: tuple, leaves, entry: Entry, graphed=None):
        """`key`: the call's key as function.py builds it, (structure, leaf keys, modes, context)."""
        _, leaf_keys, self.modes, self.context = key
        self.fn = fn
        self.count = len(leaves)
        self.tensors = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        tensors = [leaves[i] for i in self.tensors]
        self.check = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        self.others = [(i, k) for i, k in enumerate(leaf_keys) if not isinstance(leaves[i], torch.Tensor)]
        self.entry = entry
        self.graphed = graphed
        # the record it replays, held weakly: a record the graphs' bound drops frees its memory
        self.record = None if graphed is None else weakref.ref(graphed.records[()])
        # call(args, context_state) -> the result or MISS: these checks and the replay written out
        # (hot_source.py); the entry's earlier hot path lends its code where the source is the same
        self.call, self.source, self.code = written(self, getattr(fn, "__name__", None), entry.hot)

    def stale(self) -> bool:
        """A graphed entry's hot path whose record is no longer the one its Graphed replays."""
        return self.graphed is not None and self.record() is not self.graphed.records.get(())

    def __call__(self, args: tuple, context_state):
        """The call's result, or MISS (nothing has run then)."""
        return self.call(args, context_state)


def hot_path(fn, key: tuple, leaves, entry) -> HotPath | None:
    """The hot path of a signature whose entry just served a call, or None where the keyed way must
    run every call: no C++ guards, an entry that is not compiled code, one that checks its
    arguments first (an input it writes into, constants it watches), arguments flattened from
    containers, or a graphed entry whose record needs more than a replay (saved values for a
    backward)."""
    if TensorGuards is None or type(entry) is not Entry or entry.mutated or entry.watched:
        return None
    if not isinstance(key[0], int):  # (a TreeSpec: keyword arguments, containers, defaults bound)
        return None
    graphed = entry.graphed
    if graphed is not None:
        record = graphed.records.get(())
        if record is None or record.saved or not graphed.fixed:
            return None
    try:
        return HotPath(fn, key, leaves, entry, graphed)
    except Exception as err:  # noqa: BLE001 - a hot path is an optimization: the keyed way serves every call
        logs.recompiles.info("no hot path for this signature (%s: %s): every call is keyed", type(err).__name__, err)
        return None
