"""The custom ops a chunked region runs as (chunked_rows.py's `Region`, by its registry key).

    minicomp::chunked_rows(inputs, key)                  the region's row results
    minicomp::chunked_rows_backward(inputs, grads, key)  its inputs' gradients, each chunk's product made again
    minicomp::chunked_rows_early(inputs, tail_inputs, key)
        the results, then the gradients for the weights the linear tail gives them (linear_tail.py),
        then those weights; its backward scales the gradients by the loss's gradient

All are opaque to AOTAutograd and extern calls to the pipeline; registering them is importing this
module (row_regions.py does, before it writes a call of one into a graph).
"""

from __future__ import annotations

import torch

from minicomp import config
from minicomp.dispatch.chunked_rows import REGIONS, ROWS, Region


def _region(key: str) -> Region:
    try:
        return REGIONS[key]
    except KeyError:
        raise RuntimeError(
            f"minicomp::chunked_rows region {key} is not known in this process (it is registered when "
            "the graph that uses it is compiled)"
        ) from None


def _in_force(region: Region):
    """The tunables in force where the region was found (torch.compile's options: "pad_matmuls",
    the fallback policy, ...), for the chunks' padding and the compiles of their kernels."""
    return config.override(**region.settings)


@torch.library.custom_op("minicomp::chunked_rows", mutates_args=())
def chunked_rows(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    """The row results of region `key` over inputs (a, b, bias?, *sides), a chunk at a time."""
    region = _region(key)
    with _in_force(region):
        return region.forward(inputs)


@chunked_rows.register_fake
def _chunked_rows_fake(inputs, key):
    device = inputs[0].device
    return [inputs[0].new_empty(shape, dtype=dtype, device=device) for shape, dtype, _ in _region(key).outputs]


@torch.library.custom_op("minicomp::chunked_rows_backward", mutates_args=())
def chunked_rows_backward(inputs: list[torch.Tensor], grads: list[torch.Tensor | None], key: str) -> list[torch.Tensor]:
    """The gradients of region `key`'s differentiable inputs, a chunk at a time."""
    region = _region(key)
    with _in_force(region):
        return region.backward(inputs, grads)


@chunked_rows_backward.register_fake
def _chunked_rows_backward_fake(inputs, grads, key):
    region = _region(key)
    first_side = 3 if region.bias else 2
    return [
        inputs[i].new_empty(inputs[i].shape)
        if i >= first_side and region.sides[i - first_side][0] == ROWS
        else torch.empty_like(inputs[i], memory_format=torch.preserve_format)
        for i in region.diff
    ]


def _setup_context(ctx, inputs, output):
    tensors, key = inputs
    ctx.save_for_backward(*tensors)
    ctx.key = key


def _backward(ctx, grads):
    region = _region(ctx.key)
    inputs = list(ctx.saved_tensors)
    found = chunked_rows_backward(inputs, list(grads), ctx.key) if region.diff else []
    result: list = [None] * len(inputs)
    for i, grad in zip(region.diff, found):
        result[i] = grad
    return result, None


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "minicomp::chunked_rows_backward is not differentiable (a double backward through a chunked loss)"
    )


chunked_rows.register_autograd(_backward, setup_context=_setup_context)
chunked_rows_backward.register_autograd(_no_double_backward)


@torch.library.custom_op("minicomp::chunked_rows_early", mutates_args=())
def chunked_rows_early(inputs: list[torch.Tensor], tail_inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    """Region `key`'s row results, then its diff inputs' gradients for the incoming gradients
    `weights` its linear tail gives the results (tail_inputs: what else the tail reads), then
    those weights: a chunk at a time, each chunk's product made once."""
    region = _region(key)
    with _in_force(region):
        weights = region.tail_weights(tail_inputs, inputs[0].device)
        outs, grads = region.forward_with_gradients(inputs, weights)
    return [*outs, *grads, *_unaliased(weights, [*inputs, *tail_inputs])]


def _unaliased(weights: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """`weights`, each one sharing memory with an input or an earlier weight copied (a custom op's
    outputs may not alias: two results summed into the loss have one gradient, expanded twice),
    and each laid out as the fake kernel says, densely (the tail's gradient of a mean is one value
    expanded, stride 0: a compiled backward reads it at stride 1)."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    found = []
    for w in weights:
        if not w.is_contiguous() or w.untyped_storage().data_ptr() in taken:
            w = w.clone(memory_format=torch.contiguous_format)
        taken.add(w.untyped_storage().data_ptr())
        found.append(w)
    return found


@chunked_rows_early.register_fake
def _chunked_rows_early_fake(inputs, tail_inputs, key):
    outs = _chunked_rows_fake(inputs, key)
    return [*outs, *_chunked_rows_backward_fake(inputs, [], key), *(o.new_empty(o.shape) for o in outs)]


def _early_setup_context(ctx, inputs, output):
    tensors, tail_inputs, key = inputs
    n, d = len(_region(key).outputs), len(_region(key).diff)
    ctx.save_for_backward(*output[n:])  # the gradients and the weights: no input, no product
    ctx.key, ctx.n_inputs, ctx.n_tail, ctx.d = key, len(tensors), len(tail_inputs), d


def _early_backward(ctx, grads):
    """The saved gradients times the loss's gradient G (`_loss_gradient`): the results' incoming
    gradients are G * weights (the tail is linear)."""
    region = _region(ctx.key)
    saved = ctx.saved_tensors
    gradients, weights = saved[: ctx.d], saved[ctx.d :]
    pairs = [(g.float(), w.float()) for g, w in zip(grads[: len(weights)], weights) if g is not None]
    result: list = [None] * ctx.n_inputs
    if pairs:
        scale = _loss_gradient(pairs)
        for i, gradient in zip(region.diff, gradients):
            result[i] = (gradient.float() * scale).to(gradient.dtype)  # (one kernel in a compiled backward)
    return result, [None] * ctx.n_tail, None


def _loss_gradient(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The loss's gradient G from (incoming gradients, weights) pairs, each gradient G * its weight:
    <grads, weights> / <weights, weights> over the weights that are finite and not zero. Where no
    weight is (every row ignored: a mean's weights 1/0, or 0/0 for a mask over its sum), the saved
    gradients, backpropagated from weights of 0, +-inf or NaN, hold 0 (a row a where selected
    away), +-inf or NaN only, and any G > 0 scales them alike: G is the sign an infinite weight's
    gradient gives, else 0 (NaN gradients: G was 0), which keeps each 0 and makes the rest NaN, as
    eager's backward of those gradients does."""
    along = norm = signs = 0
    kept = [w.isfinite() & (w != 0) for _, w in pairs]
    finite = [torch.where(k, w, 0) for k, (_, w) in zip(kept, pairs)]
    # (the weights over their largest: a loss scaled by 1e-22 squares them to no float32 underflow)
    largest = torch.stack([f.abs().amax() for f in finite]).amax().clamp_min(torch.finfo(torch.float32).tiny)
    for (g, w), k, f in zip(pairs, kept, finite):
        f = f / largest
        along = along + torch.where(k, g * f, 0).sum()
        norm = norm + (f * f).sum()
        infinite = (w.abs() == torch.inf) & (g.abs() == torch.inf)  # (not isinf: minicomp lowers no isinf)
        signs = signs + torch.where(infinite, g.sign() * w.sign(), 0).sum()
    least_squares = along / norm.clamp_min(torch.finfo(torch.float32).tiny) / largest
    return torch.where(norm > 0, least_squares, signs.clamp(-1, 1))


chunked_rows_early.register_autograd(_early_backward, setup_context=_early_setup_context)
