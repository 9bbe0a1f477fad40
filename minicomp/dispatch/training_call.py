"""A training call without AOTAutograd's runtime: the compiled forward and backward as one
autograd.Function.

AOTAutograd traces and partitions a training signature once (autograd.py); each later call
then goes through its runtime wrappers, which handle what a graph may do (mutate an input,
return an alias, take symbolic sizes, subclasses, RNG state). For a graph that does none of it
those wrappers are most of the host's time.

`LeanCall.build` says whether the signature's graphs are that simple, by what the first call
showed (no input mutated, no output sharing memory with an input or another output) and by
the graphs' own counts (the forward returns the outputs, then exactly what the backward reads
before its tangents; a tangent per output that requires grad; a gradient per input). If so,
later calls run `LeanFunction`: the forward's outputs past the user's are saved
(`save_for_backward`); the backward lays each incoming gradient out as the tangent it was traced
for (AOTAutograd's coercion), clears the context's saved tensors when the graph will not be
used again (so the boxed backward frees each at its last use, as under AOTAutograd), and runs
the compiled backward with autocast off, as AOTAutograd does (the graphs hold their casts).
Anything else keeps AOTAutograd's function. A backward with grad mode on (`create_graph=True`,
a double backward) runs eager's instead: the outputs recomputed from the saved inputs, then
differentiated with create_graph (`eager_backward`), as the compiled backward is not
differentiable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable


@dataclass(frozen=True)
class LeanCall:
    forward: object  # boxed([inputs]) -> outputs (pipeline.Compiled.boxed)
    backward: object  # boxed([saved..., tangents...]) -> a gradient (or None) per input
    differentiable: tuple[bool, ...]  # per user output (first among the forward graph's): gets a tangent
    tangents: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (shape, stride) traced per tangent
    eager: object  # eager(inputs) -> the user's outputs, computed eagerly (a differentiable backward); None
    # where the forward draws random numbers, which a recomputation would draw anew

    @staticmethod
    def build(forward, backward, inputs: int, differentiable: tuple[bool, ...], eager) -> LeanCall | None:
        """The lean call for compiled `forward`/`backward` (pipeline.Compiled) of `inputs` tensors
        whose outputs require grad as `differentiable` says, or None where AOTAutograd must stay.
        The caller has checked the first call (`simple_first_call`). `eager` recomputes the outputs
        for a backward that must itself be differentiable (`create_graph=True`)."""
        fw_outs = _output_nodes(forward.fx)
        placeholders = [n for n in backward.fx.graph.nodes if n.op == "placeholder"]
        tangents = [n for n in placeholders if n.name.startswith("tangents")]
        saved = len(placeholders) - len(tangents)
        if (
            len(fw_outs) != len(differentiable) + saved
            or placeholders[saved:] != tangents
            or len(tangents) != sum(differentiable)
            or len(_output_nodes(backward.fx)) != inputs
            or not all(isinstance(n.meta.get("val"), torch.Tensor) for n in tangents)
            or not all(isinstance(getattr(n, "meta", {}).get("val"), torch.Tensor) for n in fw_outs)  # no sizes saved
        ):
            return None
        layouts = tuple((tuple(n.meta["val"].shape), tuple(n.meta["val"].stride())) for n in tangents)
        return LeanCall(forward.boxed, backward.boxed, differentiable, layouts, eager)

    def __call__(self, tensors) -> tuple:
        return LeanFunction.apply(self, *tensors)


class LeanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: LeanCall, *inputs):
        results = _without_autocast(call.forward, list(inputs))
        count = len(call.differentiable)
        outputs = tuple(results[:count])
        ctx.call = call
        ctx.saved = len(results) - count
        # for a double backward only: the inputs alive anyway (leaves: parameters, the caller's
        # tensors), not intermediates, which would stay alive until the backward for it
        ctx.save_for_backward(*results[count:], *(t if t.is_leaf else None for t in inputs))
        ctx.mark_non_differentiable(*(o for o, d in zip(outputs, call.differentiable) if not d))
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        if torch.is_grad_enabled():  # create_graph=True: the compiled backward is not differentiable
            return (None, *eager_backward(call.eager, call.differentiable, ctx.saved_tensors[ctx.saved :], grads))
        return _compiled_backward(ctx, *grads)


@once_differentiable
def _compiled_backward(ctx, *grads):
    call = ctx.call
    args = list(ctx.saved_tensors[: ctx.saved])
    ctx.maybe_clear_saved_tensors()  # the list is then what holds them: freed at last use
    layouts = iter(call.tangents)  # one per output that gets a tangent, in order
    for grad, wanted in zip(grads, call.differentiable):
        if wanted:
            args.append(_laid_out(grad, *next(layouts)))
    return (None, *_without_autocast(call.backward, args))


def eager_backward(eager, differentiable: tuple[bool, ...], inputs, grads) -> list:
    """The inputs' gradients as eager computes them, differentiable: the outputs recomputed
    eagerly from the inputs, then `torch.autograd.grad` with create_graph (a double backward).
    `eager` is None where recomputing would not give the forward's values (it draws random
    numbers, or writes into its inputs): refused, rather than gradients that lose their terms."""
    if eager is None:
        raise RuntimeError(
            "minicomp cannot differentiate its compiled backward (create_graph=True) of a function that draws "
            "random numbers or writes into its inputs: call that function eagerly where you need it"
        )
    if any(t is None for t in inputs):
        raise RuntimeError(
            "minicomp cannot differentiate its compiled backward (create_graph=True) here: an input is an "
            "intermediate value it does not keep for a second backward. Call that function eagerly where "
            "you need it, or pass leaf tensors"
        )
    with torch.enable_grad():
        outputs = eager(list(inputs))
    pairs = [
        (o, g)
        for o, g, d in zip(outputs, grads, differentiable)
        if d and g is not None and isinstance(o, torch.Tensor) and o.requires_grad
    ]
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    result = [None] * len(inputs)
    if pairs and wanted:
        found = torch.autograd.grad(
            [o for o, _ in pairs],
            [inputs[i] for i in wanted],
            [g for _, g in pairs],
            create_graph=True,
            allow_unused=True,
        )
        for i, g in zip(wanted, found):
            result[i] = g
    return result


def _without_autocast(graph, args: list):
    """graph(args) with autocast off on the args' device: the traced graphs hold their casts."""
    device = args[0].device.type if args else "cpu"
    if torch.is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            return graph(args)
    return graph(args)


def _laid_out(grad: torch.Tensor, shape, stride) -> torch.Tensor:
    """`grad` with the strides its tangent was traced with (a copy only where they differ)."""
    if tuple(grad.stride()) == stride or grad.numel() <= 1:
        return grad
    out = torch.empty_strided(shape, stride, dtype=grad.dtype, device=grad.device)
    return out.copy_(grad)


def _output_nodes(gm: torch.fx.GraphModule) -> list:
    (node,) = [n for n in gm.graph.nodes if n.op == "output"]
    values = node.args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def simple_first_call(inputs, outputs, mutated) -> bool:
    """Whether AOTAutograd's first call of a signature did nothing its wrappers exist for: no
    input mutated, every output a tensor of its own memory (no alias of an input or another
    output, which AOTAutograd regenerates as a view)."""
    if mutated or not all(isinstance(o, torch.Tensor) for o in outputs):
        return False
    return not _shares_memory(list(outputs) + list(inputs), len(outputs))


def _shares_memory(tensors, outputs: int) -> bool:
    """Whether one of the first `outputs` tensors shares storage with any other tensor."""
    seen = {}
    for k, t in enumerate(tensors):
        key = (t.device, t.untyped_storage().data_ptr())
        if key in seen and (k < outputs or seen[key] < outputs) and t.untyped_storage().nbytes() > 0:
            return True
        seen.setdefault(key, k)
    return False
