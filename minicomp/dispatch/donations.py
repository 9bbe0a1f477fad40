"""Donated saved activations: a backward may write over a saved value it reads for the last time.

AOTAutograd's boxed backward frees its saved activations as it goes (codegen/wrapper.py). Where a
saved value's memory is no one else's, a kernel of the backward may write its store into it
(codegen/reuse.py `reused_in_place`, `Plan.donated`): cross-entropy's logits take their own
gradient, as Inductor's donated buffers do. A saved value is donated when

- its traced storage is no forward input's, no user output's, no gradient's and no other saved
  value's (AOTAutograd's rule for donated buffers, on the traced graphs' fake tensors), and
- the compiled forward wrote it into memory of its own (`exclusive_outputs`: not a view, not the
  interior of a padded buffer another saved value reaches).

A second backward over the same saved values (`retain_graph=True`) gets copies of them (`kept`).
"""

from __future__ import annotations

import collections

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from minicomp.plan.storages import exclusive_outputs

__all__ = ["donated", "exclusive_outputs", "kept"]


def donated(
    forward: torch.fx.GraphModule, backward: torch.fx.GraphModule, saved: int, exclusive: frozenset[str]
) -> frozenset[str]:
    """The backward's inputs it may take the memory of: of the forward's last `saved` outputs (what
    its backward reads), those the rule above admits and `exclusive` (the compiled forward's
    `exclusive_outputs`) names."""
    fw_outputs = list(next(reversed(forward.graph.find_nodes(op="output"))).args[0])
    bw_outputs = list(next(reversed(backward.graph.find_nodes(op="output"))).args[0])
    if not 0 < saved <= len(fw_outputs):
        return frozenset()
    values = [n for n in fw_outputs[len(fw_outputs) - saved :] if isinstance(n, torch.fx.Node)]
    others = list(forward.graph.find_nodes(op="placeholder")) + fw_outputs[: len(fw_outputs) - saved] + bw_outputs
    taken = {s for s in map(_storage, others) if s is not None}
    mine = [_storage(n) for n in values]
    count = collections.Counter(mine)
    alone = [n.name for n, s in zip(values, mine) if s is not None and s not in taken and count[s] == 1]
    return frozenset(alone) & exclusive


def _storage(node):
    """The storage of a node's traced value (a fake tensor), to compare aliasing by."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    return StorageWeakRef(value.untyped_storage())


def kept(run, backward: torch.fx.GraphModule, names: frozenset[str]):
    """`run` (a backward that may write over its donated inputs `names`), whose call under
    retain_graph (the saved values are read again by a second backward) gets copies of them."""
    if not names:
        return run
    positions = [i for i, n in enumerate(backward.graph.find_nodes(op="placeholder")) if n.name in names]

    def guarded(args):
        if torch._C._autograd._get_current_graph_task_keep_graph():
            for i in positions:
                args[i] = args[i].clone(memory_format=torch.preserve_format)
        return run(args)

    guarded._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return guarded
