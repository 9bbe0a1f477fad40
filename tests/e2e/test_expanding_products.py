"""Expanding products (attention scores `q @ k^T`) recomputed in the backward, not saved
(dispatch/expanding_products.py, config "recompute_for_memory").

Through minicomp.jit's training path and torch.compile: the forward saves q and k (the product's
own gradients read them) and the softmax's row statistics, not the [B * H, S, S] scores nor their
softmax; gradients match eager in every dtype; the rule leaves alone contracting products (the
probabilities times v, a linear layer), long contractions, products the backward never reads, a
user's checkpoint policy, and everything when the config is off.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import grads_match
from torch.utils.checkpoint import CheckpointPolicy

import minicomp
from minicomp import capture
from minicomp.dispatch import expanding_products, saved_layouts

B, H, S, D = 2, 2, 32, 8


def _attention(x, wq, wk, wv):
    """Attention written out, as BERT's eager attention: scores, a float32 softmax, times v."""
    q, k, v = ((x @ w).view(B, S, H, D).transpose(1, 2) for w in (wq, wk, wv))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    probabilities = torch.softmax(scores.float(), -1).to(x.dtype)
    return probabilities @ v


def _inputs(device, dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(B, S, H * D, device=device, dtype=dtype)
    return x, *(torch.randn(H * D, H * D, device=device, dtype=dtype) / 4 for _ in range(3))


def _saved_shapes(entry) -> list[tuple[int, ...]]:
    graph = entry.forward.graph
    return [tuple(graph[s].meta.shape) for s in graph.outputs[1:] if isinstance(s, str)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_scores_are_recomputed_not_saved(device, dtype):
    entry = grads_match(_attention, *_inputs(device, dtype))
    shapes = _saved_shapes(entry)
    assert (B * H, S, S) not in shapes and (B, H, S, S) not in shapes, shapes
    assert shapes.count((B * S, H * D)) >= 2, shapes  # q's and k's products, saved for their own gradients


def test_float16_gradients_as_with_the_scores_saved(device):
    """(float16 against float32 eager is off by the probabilities' rounding to float16, with the
    scores saved or not: the recomputed backward is compared with the saving one.)"""
    got = []
    for recompute in (True, False):
        args = [t.requires_grad_() for t in _inputs(device, torch.float16)]
        with minicomp.config.override(recompute_for_memory=recompute):
            minicomp.jit(_attention)(*args).float().sum().backward()
        got.append([a.grad for a in args])
    for on, off in zip(*got):
        torch.testing.assert_close(on, off, atol=1e-3, rtol=1e-2)


def test_off_the_scores_or_their_softmax_are_saved(device):
    with minicomp.config.override(recompute_for_memory=False):
        entry = grads_match(_attention, *_inputs(device))
    shapes = _saved_shapes(entry)
    assert any(s in shapes for s in ((B * H, S, S), (B, H, S, S))), shapes


def test_through_torch_compile_the_forward_saves_no_scores(device, monkeypatch):
    forwards = []
    mark = saved_layouts.mark
    monkeypatch.setattr(saved_layouts, "mark", lambda fw, bw: (forwards.append(fw), mark(fw, bw))[1])
    torch._dynamo.reset()
    args = [t.requires_grad_() for t in _inputs(device)]
    out = torch.compile(_attention, backend="minicomp")(*args)
    out.sum().backward()
    got = [a.grad for a in args]
    for a in args:
        a.grad = None
    _attention(*args).sum().backward()
    for mine, eager in zip(got, (a.grad for a in args)):
        torch.testing.assert_close(mine, eager, atol=1e-4, rtol=1e-4)
    saved = list(forwards[-1].graph.nodes)[-1].args[0][1:]
    numels = [n.meta["val"].numel() for n in saved if isinstance(n.meta.get("val"), torch.Tensor)]
    assert max(numels) < B * H * S * S, numels
    torch._dynamo.reset()


def _joint(fn, *shapes):
    """The joint graph AOTAutograd hands the partition for `fn` on random inputs of these shapes (ops
    decomposed as minicomp's capture does: a softmax as its reductions and pointwise ops)."""
    from functorch.compile import aot_function

    graphs = []

    def partition(joint, inputs, **kwargs):
        from functorch.compile import default_partition

        graphs.append(joint.graph)
        return default_partition(joint, inputs, **kwargs)

    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    compiled = aot_function(
        fn, fw_compiler=_boxed, bw_compiler=_boxed, partition_fn=partition, decompositions=capture.decompositions()
    )
    outs = compiled(*args)
    sum(o.sum() for o in (outs if isinstance(outs, (tuple, list)) else (outs,))).backward()
    return graphs[0]


def _boxed(gm, example_inputs):
    from functorch.compile import make_boxed_func

    return make_boxed_func(gm.forward)


def _tagged(graph) -> list[str]:
    names = set(expanding_products.mark(graph))
    return [str(n.target) for n in graph.nodes if n.name in names]


def test_the_rule_marks_the_scores_and_their_softmax_alone():
    graph = _joint(_attention, (B, S, H * D), (H * D, H * D), (H * D, H * D), (H * D, H * D))
    tagged = _tagged(graph)
    assert [t for t in tagged if "mm" in t] == ["aten.bmm.default"]  # not probabilities @ v, nor the linears
    assert {"aten.exp.default", "aten.div.Tensor"} <= set(tagged), tagged  # the softmax's [B, H, S, S] values
    assert "aten.amax.default" not in tagged and "aten.sum.dim_IntList" not in tagged  # its row statistics


def _masked_attention(x, wq, wk, wv, mask):
    """SDPA's math form with a boolean mask (what a GPU trace of BERT's SDPA call holds): masked
    rows, a where over rows with no key left."""
    q, k, v = ((x @ w).view(B, S, H, D).transpose(1, 2) for w in (wq, wk, wv))
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0]


@pytest.mark.parametrize("recompute", [True, False])
def test_masked_math_attention_saves_no_square_value(device, recompute):
    mask = torch.rand(B, 1, S, S, device=device) > 0.2
    mask[0, 0, 3] = False  # a row with no key: its probabilities are zeros
    with minicomp.config.override(recompute_for_memory=recompute):
        entry = grads_match(_masked_attention, *_inputs(device), mask, grad_of=[0, 1, 2, 3])
    square = [s for s in _saved_shapes(entry) if s[-2:] == (S, S) and math.prod(s) >= B * H * S * S]  # (not the mask)
    assert (square == []) == recompute, _saved_shapes(entry)


def test_a_long_contraction_or_a_product_no_wider_than_its_operands_is_saved():
    long = _joint(lambda a, b: (a @ b).exp(), (2048, 260), (260, 2048))  # 4x its operands, over 260
    assert _tagged(long) == []
    square = _joint(lambda a, b: (a @ b).exp(), (64, 64), (64, 64))
    assert _tagged(square) == []
    outer = _joint(lambda a, b: (a @ b).exp(), (256, 4), (4, 256))  # 256 x 256 from 2 x 1024 values
    assert _tagged(outer) == ["aten.mm.default"]


def test_a_product_the_backward_does_not_read_one_returned_and_a_users_policy_are_left_alone():
    graph = _joint(lambda a, b: (a @ b).sum() * 2, (256, 4), (4, 256))  # the sum's gradient reads no product
    assert _tagged(graph) == []
    graph = _joint(lambda a, b: (lambda p: (p, p.exp()))(a @ b), (256, 4), (4, 256))  # the product returned
    assert _tagged(graph) == []
    graph = _joint(lambda a, b: (a @ b).exp(), (256, 4), (4, 256))
    product = next(n for n in graph.nodes if n.target is torch.ops.aten.mm.default)
    product.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    assert expanding_products.mark(graph) == []
    assert product.meta["recompute"] is CheckpointPolicy.MUST_SAVE


def test_a_symbolic_size_is_read_at_its_hint():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    size = env.create_symintnode(env.create_symbol(256, source=ConstantSource("s")), hint=256)
    assert isinstance(size, torch.SymInt)
    assert expanding_products._hint(size) == 256
    assert expanding_products._hint(7) == 7


def test_a_mask_drawn_from_a_full_like_of_the_scores_is_left_alone():
    """`full_like(scores, p)` reads the scores' shape alone: the walk stops there, and the scores
    are not read by the backward for it (a hand-written dropout's bool mask stays saved)."""

    def masked(q, k):
        scores = q @ k.transpose(-1, -2)
        return (scores * torch.bernoulli(torch.full_like(scores, 0.7))).sum(-1)

    assert _tagged(_joint(masked, (2, 2, 64, 16), (2, 2, 64, 16))) == []


def test_a_product_returned_through_a_view_is_not_recomputed():
    """Logits [B * S, V] returned as [B, S, V] (a language model's): the caller holds them, so
    the backward does not make the product again; what the loss computes from it still is."""

    def head(h, w):
        logits = h @ w.t()
        return logits, torch.logsumexp(logits.view(-1, 512), -1).mean()

    tagged = _tagged(_joint(head, (4, 64, 16), (512, 16)))
    assert "aten.mm.default" not in tagged and tagged, tagged
