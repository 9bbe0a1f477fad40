"""Training with reductions (issue #16): gradients against eager, kernel counts, what is saved.

A norm's backward is a row reduction (dx needs a sum over each row) and a column
reduction (dW sums over every row): the column one is split into the row groups
of the row kernel (split_reductions.py), so dx and the partial dW rows come out of
one kernel and a second one adds the partials. Cross-entropy's backward scatters
the one-hot of the targets (ops/indexed.py `scatter`): one kernel writes the
gradient of the logits. 16-bit gradients are judged against eager on float32
copies (test_autograd.grads_match).
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import aten_call, check, grads_match, kernel_count, kernel_text

import minicomp
from minicomp import config
from minicomp.lowering.ops import NodeKind
from minicomp.tools.workloads import cross_entropy, layer_norm, llama_block, rms_norm, softmax

DTYPES = [torch.float32, torch.bfloat16]


def log_softmax(x):
    return torch.log_softmax(x, -1)


def _params(*shapes, dtype, device):
    return [torch.randn(*s, dtype=dtype, device=device) for s in shapes]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 48), (2, 24, 40), (7, 33)], ids=["2d", "3d", "one-group"])
def test_rms_norm_backward_is_two_kernels(device, dtype, shape):
    x, w = _params(shape, shape[-1:], dtype=dtype, device=device)
    entry = grads_match(rms_norm, x, w)
    assert kernel_count(entry.forward.source) == 1
    assert kernel_count(entry.backward.source) == 2  # dx with the partial dW rows, then their sum
    assert "partial column results of" in entry.backward.source
    entry = grads_match(lambda x, w: F.rms_norm(x, shape[-1:], w), x, w)
    assert kernel_count(entry.backward.source) == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward_writes_dx_dw_db_in_two_kernels(device, dtype):
    x, w, b = _params((48, 40), (40,), (40,), dtype=dtype, device=device)
    entry = grads_match(layer_norm, x * 3 + 1, w, b)
    assert kernel_count(entry.backward.source) == 2
    first = kernel_text(entry.backward.source)[0]
    assert first.count("_acc = tl.full([1, RBLOCK]") == 2  # dW and db partial rows beside dx


def test_each_program_sums_its_row_group(device):
    """With a small target the rows split into several groups; each program writes its row."""
    x, w = _params((96, 32), (32,), dtype=torch.float32, device=device)
    with config.override(group_programs=4, group_min_rows=8):
        entry = grads_match(rms_norm, x, w)
    source = entry.backward.source
    assert "24 rows a program" in source and "groups=4" in source
    assert "for xoffset in tl.range(0, 24, XBLOCK, num_stages=2)" in source


def test_row_groups_no_row_kernel_of_their_stage_takes_read_their_source(device):
    """A broadcast embedding's gradient (a sum over the batch of x's gradient, grouped by rows)
    comes a stage after x's gradient, which the norm's backward kernel writes: its kernel reads
    that gradient. It stored the [1, 4, 6, 16] chunks view in the norm's kernel, which had no place
    for it (a backward compile error of every pre-norm stack over a broadcast embedding)."""

    def fn(x, emb, norm_w, w):
        h = x + emb
        h = h + rms_norm(h, norm_w) @ w
        return rms_norm(h, norm_w)

    x, emb, norm_w, w = _params((4, 6, 16), (6, 16), (16,), (16, 16), dtype=torch.float32, device=device)
    entry = grads_match(fn, x, emb, norm_w, w)
    assert entry.backward.plan is not None


def test_row_groups_keep_one_accumulator_row_for_sums_maxima_and_minima(device):
    """Each program adds each step's XBLOCK rows into one partial row ([1, RBLOCK]); max and min
    combine the same way, a NaN in a column carried to the result as eager carries it."""

    def norm_and_columns(x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h, (h * 2).amax(0), (h * 3).amin(0), h.sum(0)

    x = torch.randn(96, 32, device=device)
    x[50, 7] = float("nan")
    with config.override(group_programs=4, group_min_rows=8):
        compiled = minicomp.jit(norm_and_columns)
        got = compiled(x)
        source = compiled.compiled(x).source
    assert "groups=4" in source and source.count("_partial_acc = tl.full([1, RBLOCK]") == 3
    for a, b in zip(got, norm_and_columns(x)):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_backward_compiles_with_the_settings_of_its_forward(device):
    """Regression: autograd runs a GPU backward on a thread of its own, where a `config.override`
    around the call was not in effect: the backward compiled with the defaults."""
    x, w = (t.requires_grad_() for t in _params((96, 32), (32,), dtype=torch.float32, device=device))
    compiled = minicomp.jit(rms_norm)
    with config.override(group_programs=4, group_min_rows=8):
        out = compiled(x, w)
    worker = threading.Thread(target=lambda: out.backward(torch.ones_like(out)))
    worker.start()
    worker.join()
    assert "groups=4" in compiled.entry(x, w).backward.source
    assert x.grad is not None and w.grad is not None


def test_row_count_without_a_near_divisor_is_not_grouped(device):
    """97 rows: no group size within 2x of the target divides them; dW is its own reduction."""
    x, w = _params((97, 32), (32,), dtype=torch.float32, device=device)
    with config.override(group_programs=8, group_min_rows=16):
        entry = grads_match(rms_norm, x, w)
    assert "partial column results" not in entry.backward.source


def test_looped_rows_are_not_grouped(device):
    """A row too long to hold whole has no row kernel to ride in: dW stays a column reduction."""
    x, w = _params((8, 40), (40,), dtype=torch.float32, device=device)
    with config.override(persistent_rows=16, loop_block=16):
        entry = grads_match(rms_norm, x, w)
    assert "partial column results" not in entry.backward.source


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [softmax, log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_backward_is_one_kernel(device, fn, dtype):
    (x,) = _params((6, 50), dtype=dtype, device=device)
    entry = grads_match(fn, x * 3)
    assert kernel_count(entry.backward.source) == 1


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_backward_is_one_kernel(device, dtype, looped):
    settings = dict(persistent_rows=8, loop_block=16) if looped else {}
    # 40 a row: a multiple of 8, one loop with no last step apart (test_reduction_forms checks those)
    logits = torch.randn(6, 40, dtype=dtype, device=device) * 3
    y = torch.randint(0, 40, (6,), device=device)
    y[2] = -100  # ignored: no gradient on its row
    with config.override(**settings):
        entry = grads_match(cross_entropy, logits, y, grad_of=[0])
    source = entry.backward.source
    assert kernel_count(source) == 1, source
    assert "aten.scatter" in source and not aten_call(source, "scatter")  # in the kernel, not an ATen call
    # the logits are read once, in the pass that writes their gradient; the forward saves per-row values
    assert source.count("tl.load(primals_1_ptr") == 1
    saved = [entry.forward.graph[n].meta.shape for n in entry.forward.graph.outputs[1:]]
    assert all(s == (6, 40) or s.numel() <= 6 for s in map(torch.Size, saved)), saved


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i: torch.zeros_like(x).scatter(1, i, 1.0),  # one-hot
        lambda x, i: x.scatter(1, i, -2.5),
        lambda x, i: x.scatter(0, i.T[:, :3] % 4, 7.0),  # along dim 0, an index covering 3 of 5 columns
        lambda x, i: x.scatter(1, i[:3], x[:, :1] * 2),  # src tensor, index over 3 of 4 rows
        lambda x, i: F.one_hot(i[:, 0], 5).float() + x,
    ],
)
def test_one_hot_scatter_matches_eager(device, fn):
    x = torch.randn(4, 5, device=device)
    i = torch.tensor([[3], [0], [4], [3]], device=device)
    check(fn, x, i)


def test_scatter_of_a_longer_index_runs_as_an_aten_call(device):
    x = torch.randn(4, 5, device=device)
    i = torch.tensor([[3, 1], [0, 2], [4, 4], [3, 0]], device=device)
    source = check(lambda x, i: (x * 2).scatter(1, i, 1.0) + 1, x, i)
    assert aten_call(source, "scatter")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_to_broadcast_gradients_fuse_with_their_producer(device, dtype):
    """The gradient of a broadcast bias and per-channel scale is a column sum of the pointwise
    gradient that feeds it, computed in the kernel that computes that gradient."""
    x, b, s = _params((32, 24), (24,), (24,), dtype=dtype, device=device)

    def f(x, b, s):
        return torch.relu(x * s + b)

    entry = grads_match(f, x, b, s)
    backward = entry.backward.source
    assert not aten_call(backward.split("def call")[1])  # nothing runs as an ATen call
    # dx and the partial rows of db and ds in one pass over the gradient, then the partials' sums
    assert kernel_count(backward) == 2, backward
    assert "partial column results of sum_1_partial, sum_2_partial" in backward


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_training_step_matches_eager(device, dtype):
    """A decoder block (GQA: 2 k/v heads for 4 q heads) forward and backward: every gradient,
    by relative error against eager in float32 (its sums over rows differ by summation order).
    Regression: on the CPU the flash attention's decomposition handed its backward the attention
    weights for the logsumexp, and every gradient through SDPA came out wrong."""
    dim, hidden, batch, seq = 512, 64, 2, 8
    g = torch.Generator().manual_seed(0)

    def param(*shape, scale=None, shift=0.0):
        return torch.randn(*shape, generator=g) * (scale or shape[0] ** -0.5) + shift

    args = [param(batch, seq, dim, scale=1.0), param(dim, scale=0.1, shift=1.0), param(dim, dim), param(dim, 256)]
    args += [param(dim, 256), param(dim, dim), param(seq, 128, scale=1.0), param(seq, 128, scale=1.0)]
    args += [param(dim, scale=0.1, shift=1.0), param(dim, hidden), param(dim, hidden), param(hidden, dim)]
    trained = [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]  # all but cos and sin
    seed = torch.randn(batch, seq, dim, generator=g).to(device)

    def step(fn, dt):
        inputs = [a.detach().to(device=device, dtype=dt).requires_grad_(i in trained) for i, a in enumerate(args)]
        out = fn(*inputs)
        out.backward(seed.to(dt))
        return [out] + [inputs[i].grad for i in trained]

    expected = step(llama_block, torch.float32)
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want in zip(step(minicomp.jit(llama_block), dtype), expected):
        error = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert error < bound, error


def test_dynamo_training_forward_copies_no_views(device, monkeypatch):
    """Regression: through torch.compile(backend=minicomp) the partition saved views (a weight's
    transpose for the backward's matmul, the normalized input's [B*S, D] view), and the forward
    wrote each with a copy kernel; the Dynamo backend now partitions as `minicomp.jit` does."""
    import minicomp.dispatch.dynamo

    compiled = []

    def spy(gm, name, **kwargs):
        compiled.append(minicomp.pipeline.compile_graph(gm, name, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(minicomp.dispatch.dynamo, "compile_graph", spy)
    x, w, wo = _params((2, 8, 32), (32,), (32, 32), dtype=torch.float32, device=device)
    w, wo = w.requires_grad_(), wo.requires_grad_()
    fn = torch.compile(lambda x, w, wo: rms_norm(x, w) @ wo, backend=minicomp.dispatch.dynamo.backend)
    fn(x, w, wo).sum().backward()
    forward = compiled[0]
    copies = [k.name for k in forward.plan.kernels if all(forward.plan.kinds[n] is NodeKind.VIEW for n in k.nodes)]
    assert not copies, copies
    torch.testing.assert_close(w.grad, torch.func.grad(lambda w: (rms_norm(x, w) @ wo).sum())(w.detach()))
