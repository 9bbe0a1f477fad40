"""A reduction's result read at another row than the one it reduces (issue #43): the edge is cut
in the plan (plan/row_reads.py, fusion.py rule 5), not the graph sent to eager.

A reduction kernel holds each result for its own row only. `x * s + s.t()`, `s.flip(0)`, CLIP's
loss (cross-entropy of the logits and of their transpose: the backward adds a gradient computed
from a row sum to its transpose) and Falcon's multi-query key gradient (a sum over the heads,
then transposed) read it at another row: the value where that path leaves the rows (`s.t()`,
CLIP's gradient before its transpose) is written by its kernel and read back by the next. A
read at another position of a dim of extent 1 is the row's own (Mamba2's row sum scattered
into the last column), and so is a value shaped like the rows with its sized dims elsewhere
([6, 1] in a kernel over [1, 6]): those stay one kernel. Before, each raised NotImplementedError
in codegen and sent the whole graph to eager (conftest sets MINICOMP_FALLBACK=raise, so a
fallback fails these tests).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import check, grads_match, kernel_count
from torch.utils import _pytree as pytree

from minicomp import capture, ir, pipeline
from minicomp.plan import fusion, row_reads


def transposed(x):  # row sums read transposed by a fused consumer
    s = x.sum(1, keepdim=True)
    return x * s + s.t()


def flipped(x):  # ... at the mirrored row
    s = x.sum(-1, keepdim=True)
    return x * s + s.flip(0)


def max_transposed(x):  # a softmax whose max is read transposed: the max's kernel, then the rest
    m = x.amax(-1, keepdim=True)
    e = (x - m.t()).exp()
    return e / e.sum(-1, keepdim=True)


def heads_transposed(x, t):  # Falcon's multi-query key gradient: a sum over heads, transposed
    s = x.sum(1, keepdim=True) * 0.5
    return t + s.transpose(-1, -2)


def last_column(x):  # Mamba2's: the row sum scattered into the last column of its row
    s = (x * x).sum(-1, keepdim=True)
    return x - torch.slice_scatter(torch.zeros_like(x), s, 1, x.shape[1] - 1)


def last_column_cat(x):
    s = x.sum(-1, keepdim=True)
    return x * 2 + torch.cat([torch.zeros_like(x[:, :-1]), s], 1)


def column_sums_as_a_column(x, w):  # a [1, 6] row of sums read as [6, 1]: its own rows, in another shape
    return x.sum(0, keepdim=True).t() * w + x.sum(0, keepdim=True).view(6, 1)


def both_ways(x):  # CLIP's loss: log-softmax of the logits and of their transpose
    return torch.log_softmax(x, -1) + torch.log_softmax(x.t(), -1).t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [transposed, flipped, max_transposed, both_ways], ids=lambda f: f.__name__)
def test_a_result_read_at_another_row_is_written_and_read_back(device, fn, dtype):
    x = torch.randn(6, 6, device=device, dtype=dtype)
    source = check(fn, x, kernels=2)  # the reduction's kernel, then its reader's
    assert "another row than the one it reduces" in source  # the plan's refusals, in the module's text
    check(fn, torch.randn(6, 6, device=device, dtype=dtype).t())  # a transposed input


def test_a_sum_over_heads_read_transposed(device):
    x, t = torch.randn(2, 4, 8, 8, device=device), torch.randn(2, 1, 8, 8, device=device)
    check(heads_transposed, x, t, kernels=2)


@pytest.mark.parametrize("fn", [last_column, last_column_cat], ids=lambda f: f.__name__)
def test_a_read_at_the_rows_own_place_in_a_dim_of_one_stays_fused(device, fn):
    check(fn, torch.randn(6, 8, device=device), kernels=1)


def test_rows_in_a_permuted_shape_stay_fused(device):
    """A value shaped like the rows with its sized dims elsewhere ([6, 1] in a kernel over [4, 6]
    reduced over dim 0) is evaluated at the rows, not at [0, x0] (plan/row_reads.py `row_index`)."""
    x, w = torch.randn(4, 6, device=device), torch.randn(6, 1, device=device)
    check(column_sums_as_a_column, x, w, kernels=1)
    entry = grads_match(transposed, torch.randn(6, 6, device=device))
    assert kernel_count(entry.forward.source) == 2
    # the column sum's partials, their total with the row sum it meets transposed, dx
    assert kernel_count(entry.backward.source) == 3


def test_the_refusal_names_the_edge_and_the_index():
    x = torch.randn(6, 6)
    traced = capture.trace(transposed, [x], pytree.tree_flatten(((x,), {}))[1], ["x"])
    plan = fusion.plan(ir.from_fx(traced.gm, traced.input_names))
    (refusal,) = [r for r in plan.refusals if "another row" in r.reason]
    # cut where the path leaves the rows: `add` is at its place, `permute` (s.t()) is not
    assert (refusal.producer, refusal.consumer) == ("permute", "add")
    assert "add reads permute at [0, r0], which reads sum_1 at [r0, 0], another row" in refusal.reason
    assert "permute -> add: add reads permute" in str(plan)  # the fusion log's text (MINICOMP_LOGS=fusion)


@pytest.mark.parametrize("fn", [transposed, flipped, max_transposed, last_column, both_ways], ids=lambda f: f.__name__)
def test_backward(device, fn):
    grads_match(fn, torch.randn(6, 6, device=device))


def test_backward_of_clip_loss_compiles_whole(device):
    """CLIP's contrastive loss: cross-entropy over the rows and over the columns of the logits."""

    def clip_loss(img, txt):
        logits = img @ txt.t()
        target = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2

    img, txt = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    entry = grads_match(clip_loss, img, txt)
    assert "another row than the one it reduces" in entry.backward.source
    # both cross-entropies' gradients in one kernel, writing the one summed transposed; the sum
    assert kernel_count(entry.backward.source) == 2


def test_through_torch_compile(device):
    x = torch.randn(2, 4, 8, 8, device=device, requires_grad=True)
    t = torch.randn(2, 1, 8, 8, device=device, requires_grad=True)
    compiled = torch.compile(lambda x, t: heads_transposed(x, t) + flipped(t[0, 0]), backend="minicomp")
    eager = heads_transposed(x, t) + flipped(t[0, 0])
    mine = compiled(x, t)
    torch.testing.assert_close(mine, eager)
    seed = torch.randn_like(eager)
    expected = torch.autograd.grad(eager, (x, t), seed)
    torch.testing.assert_close(torch.autograd.grad(mine, (x, t), seed), expected)


def test_a_kernel_codegen_cannot_write_is_planned_again_unfused(monkeypatch, caplog):
    """Defence in depth: with the plan rule gone, codegen's NotImplementedError costs the kernel
    its fusion (pipeline.py `_unfused`), logged, not the graph its compilation."""
    monkeypatch.setattr(row_reads, "misreads", lambda graph, kernel, kinds: [])

    def fn(x):
        s = x.sum(1, keepdim=True)
        return x - s.t() * 3

    x = torch.randn(6, 6)
    traced = capture.trace(fn, [x], pytree.tree_flatten(((x,), {}))[1], ["x"])
    with caplog.at_level(logging.WARNING, logger="minicomp.fusion"):
        compiled = pipeline.compile_graph(traced.gm, "unfused", traced.input_names)
    assert "planned again with their reductions unfused" in caplog.text
    assert "sum_1 is read at another row" in caplog.text
    assert kernel_count(compiled.source) == 2
    torch.testing.assert_close(compiled.call(x)[0], fn(x))


def _training_step(model, **inputs):
    """The loss and every gradient of one step, eager and through torch.compile(backend="minicomp")."""
    loss = model(**inputs).loss
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minicomp")
    mine = compiled(**inputs).loss
    mine.backward()
    torch.testing.assert_close(mine, loss, atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        if name in expected:
            torch.testing.assert_close(p.grad, expected[name], atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mamba2", "falcon", "clip"])
def test_tiny_models_train_without_a_fallback(arch):
    """The three architectures whose backward went to eager whole (fallback raise: it would fail)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 99, (2, 16))
    if arch == "clip":
        text = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
        config = transformers.CLIPConfig(
            text_config=text | dict(max_position_embeddings=16),
            vision_config=vision | dict(image_size=16, patch_size=8),
            projection_dim=16,
        )
        model = transformers.CLIPModel(config).float()
        _training_step(model, input_ids=ids[:, :8], pixel_values=torch.randn(2, 3, 16, 16), return_loss=True)
        return
    if arch == "mamba2":
        config = transformers.Mamba2Config(
            vocab_size=99,
            hidden_size=32,
            state_size=8,
            num_hidden_layers=1,
            num_heads=4,
            head_dim=16,
            n_groups=1,
            expand=2,
            chunk_size=8,
        )
    else:  # multi-query attention: the key's gradient sums over the heads
        config = transformers.FalconConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    _training_step(model, input_ids=ids, labels=ids)
