"""Training: forward and backward graphs from AOTAutograd, both compiled by minicomp.

AOTAutograd traces the function and its gradient into an ATen forward graph
and an ATen backward graph, split by the min-cut rematerialization partition:
cheap pointwise values are recomputed in the backward instead of saved, so
the forward saves little (RoPE saves only cos and sin). Each graph then goes
through the same pipeline (compiler.compile_graph), so the backward is fused
too. Calls where no input needs a gradient never come here (api.py): the
autograd machinery costs tens of microseconds a call.
"""
from __future__ import annotations

import torch
from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
from torch.utils import _pytree as pytree

from minicomp import capture
from minicomp.compiler import Compiled, compile_graph


class TrainingEntry:
    """One signature whose inputs need gradients: an autograd.Function built by AOTAutograd."""

    def __init__(self, fn, leaves, in_spec, name: str, input_names: list[str]):
        self.tensor_slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self.forward: Compiled | None = None
        self.backward: Compiled | None = None
        self.out_spec = None
        constants = list(leaves)

        def flat_fn(*tensors):
            values = list(constants)
            for slot, t in zip(self.tensor_slots, tensors):
                values[slot] = t
            args, kwargs = pytree.tree_unflatten(values, in_spec)
            out, self.out_spec = pytree.tree_flatten(fn(*args, **kwargs))
            return out

        def compile_forward(gm, example_inputs):
            self.forward = compile_graph(gm, f"{name}_forward", input_names)
            return make_boxed_func(self.forward.call)

        def compile_backward(gm, example_inputs):
            self.backward = compile_graph(gm, f"{name}_backward")
            return make_boxed_func(self.backward.call)

        self.function = aot_function(flat_fn, fw_compiler=compile_forward, bw_compiler=compile_backward,
                                     partition_fn=min_cut_rematerialization_partition,
                                     decompositions=capture.decompositions())
        # trace and compile now, on these inputs: errors surface at compile time, not mid-training
        self(fn, leaves, in_spec)

    def __call__(self, fn, leaves, in_spec):
        outputs = self.function(*[leaves[i] for i in self.tensor_slots])
        return pytree.tree_unflatten(list(outputs), self.out_spec)

    @property
    def source(self) -> str:
        parts = [c.source for c in (self.forward, self.backward) if c is not None]
        return "\n\n# ---- backward ----\n\n".join(parts)
