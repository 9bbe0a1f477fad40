"""Capture: a Python function -> an ATen-level torch.fx GraphModule.

The only module that touches make_fx. Tracing runs on fake tensors (no real
compute), through functionalization (in-place ops become pure ops plus
`copy_` into the mutated input at the end) and PyTorch's core ATen
decompositions (silu -> x * sigmoid(x), stack -> unsqueeze + cat, ...).
Tensors the function closes over (a global weight) become constants of the
trace, like Python scalars: their values are captured when the signature is
first compiled.
"""
from __future__ import annotations

import functools

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functionalize
from torch.utils import _pytree as pytree


@functools.lru_cache(maxsize=None)
def decompositions() -> dict:
    return dict(core_aten_decompositions())


class Traced:
    """The graph of `fn` for one input signature, and how to map values in and out.

    leaves: the flattened arguments (tensors become graph inputs, everything
    else is a constant of the trace); out_spec rebuilds the output structure.
    """

    def __init__(self, gm: torch.fx.GraphModule, input_names: list[str], tensor_slots: list[int], out_spec):
        self.gm = gm
        self.input_names = input_names
        self.tensor_slots = tensor_slots
        self.out_spec = out_spec


def trace(fn, leaves: list, in_spec, leaf_names: list[str]) -> Traced:
    """Trace fn(*tree_unflatten(leaves, in_spec)) with the tensor leaves as inputs."""
    tensor_slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    out_spec = None

    def flat_fn(*tensors):
        nonlocal out_spec
        values = list(leaves)
        for slot, t in zip(tensor_slots, tensors):
            values[slot] = t
        args, kwargs = pytree.tree_unflatten(values, in_spec)
        out_leaves, out_spec = pytree.tree_flatten(fn(*args, **kwargs))
        return out_leaves

    tensors = [leaves[i] for i in tensor_slots]
    with torch.no_grad():
        gm = make_fx(functionalize(flat_fn, remove="mutations"), decomposition_table=decompositions(),
                     tracing_mode="fake", _allow_non_fake_inputs=True)(*[t.detach() for t in tensors])
    return Traced(gm, [leaf_names[i] for i in tensor_slots], tensor_slots, out_spec)


def leaf_names(in_spec, params: list[str]) -> list[str]:
    """Readable names for the flattened (args, kwargs): x, b, inputs_0, scale, ..."""
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * in_spec.num_leaves, in_spec))
    names = []
    for path, _ in paths:
        (group, first), rest = path[:2], path[2:]
        head = params[first.idx] if group.idx == 0 and first.idx < len(params) else str(getattr(first, "key", "arg"))
        names.append("_".join([head] + [str(getattr(k, "key", getattr(k, "idx", k))) for k in rest]))
    return names
