"""Split reductions (split_reductions.py) and outer reductions (rows contiguous, reduction_space.reduction_form).

The thresholds are lowered (config.override) so that small tensors split the way
a [32768, 4096] bias gradient does on a GPU; every result is compared with eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import check, kernel_count
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils import _pytree as pytree

import minicomp
from minicomp import capture, config, ir
from minicomp.plan import fusion
from minicomp.plan.split_reductions import split_reductions

SMALL = dict(split_min_numel=512, split_chunk=16, split_programs=64, split_below=32)


def whole_numbers(*shape, device="cpu"):
    """Floats that are small integers: their sums are exact in any order, so a split sum equals
    eager's to the last bit (random floats differ by summation order alone)."""
    return torch.randint(-8, 8, shape, device=device).float()


@pytest.fixture
def small():
    with config.override(**SMALL):
        yield


def plan_of(fn, *args):
    names = [f"a{i}" for i in range(len(args))]
    traced = capture.trace(fn, list(args), pytree.tree_flatten((args, {}))[1], names)
    graph = split_reductions(ir.from_fx(traced.gm, traced.input_names))
    return graph, fusion.plan(graph)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gradient_sum0_splits_in_two_kernels(device, dtype, small):
    x = whole_numbers(1024, 8, device=device).to(dtype)
    source = check(lambda x: x.sum(0), x, kernels=2)
    assert "split 64 ways for sum" in source  # the plan and the first kernel's header say so
    assert "combines the 64 partial results of a split reduction" in source


def test_partials_accumulate_in_float32(device, small):
    # 4096 ones in bfloat16: a bf16 running sum stalls at 256, float32 partials do not
    x = torch.ones(4096, 2, dtype=torch.bfloat16, device=device)
    out = minicomp.jit(lambda x: x.sum(0))(x)
    assert out.dtype == torch.bfloat16 and out.float().tolist() == [4096.0, 4096.0]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.mean(),
        lambda x: x.sum(),
        lambda x: x.amax((0, 1), keepdim=True),
        lambda x: x.amin(0),
        lambda x: x.mean((0, 1)),
        lambda x: (x > 0).any(0),
        lambda x: (x > -3).all(),
        lambda x: x.sum(0, keepdim=True) * 2 + 1,  # consumers run in the combining kernel
    ],
)
def test_each_splittable_reduction_matches_eager(device, fn, small):
    x = whole_numbers(250, 7, 3, device=device)
    source = check(fn, x)
    assert "split" in source


def test_integer_sum_splits_in_int64(device, small):
    x = torch.randint(-(2**30), 2**30, (2048, 3), dtype=torch.int32, device=device)
    source = check(lambda x: x.sum(0), x, kernels=2)
    assert "tl.int64" in source


def test_a_prime_extent_is_padded_with_the_identity(device, small):
    x = -torch.rand(1021, 4, device=device) - 1  # all negative: a pad of 0 would win the max
    source = check(lambda x: (x.amax(0), x.sum(0)), x)
    assert "padded" in source


def test_a_global_norm_divides_after_the_split(device, small):
    x = torch.randn(64, 40, device=device)
    check(lambda x: x / x.norm(), x, kernels=3)  # partial sums, their combination, the divide


def test_argmax_and_prod_are_not_split(device, small):
    x = torch.rand(1024, 4, device=device) + 0.5
    for fn in (lambda x: x.argmax(0), lambda x: x.prod(0)):
        source = check(fn, x, kernels=1)
        assert "split" not in source


def test_small_reductions_are_not_split(device):
    x = torch.randn(64, 8, device=device)
    assert "split" not in check(lambda x: x.sum(0), x, kernels=1)


def test_many_rows_are_not_split(small):
    graph, plan = plan_of(lambda x: x.sum(-1), torch.randn(4096, 32))
    assert not graph.partials and len(plan.kernels) == 1


def test_default_thresholds_split_only_what_lacks_rows():
    # plans only (torch.empty: nothing is computed). A norm over 2048 rows keeps one kernel; a
    # column sum over 32768 rows and a mean over everything are split
    x = torch.empty(2048, 4096)
    graph, plan = plan_of(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), x)
    assert not graph.partials and len(plan.kernels) == 1
    graph, plan = plan_of(lambda g: g.sum(0), torch.empty(32768, 4096))
    assert [k for _, k in graph.partials.values()] == [64] and len(plan.kernels) == 2
    graph, _ = plan_of(lambda a, b: F.mse_loss(a, b), x, x)
    assert [k for _, k in graph.partials.values()] == [2048]  # cut along the rows: each partial reads a whole row
    assert "[2048, 1, 4096]" in graph.describe()


def test_a_short_outer_dim_is_cut_with_the_dims_after_it_in_memory():
    # channels_last [64, 64, 56, 56] summed over N, H, W (a batch norm's statistics): N alone gave
    # 64 partials of 3136 elements a channel (64 programs on a 132-SM GPU: 2.5x Inductor's time);
    # N and H follow each other in memory (stride H*W*C, then W*C), so they are cut as one
    x = torch.empty(64, 64, 56, 56).to(memory_format=torch.channels_last)
    graph, plan = plan_of(lambda x: x.sum((0, 2, 3)), x)
    ((_, k),) = graph.partials.values()
    assert k > 64 and (64 * 56) % k == 0
    assert "aten.permute" in graph.describe() and len(plan.kernels) == 2
    # the partials are more than the 64 channels: stored K innermost, the combine sums each
    # channel's partials as one contiguous row (a column walk of K rows took one program)
    assert plan.kernels[0].outer and not plan.kernels[1].outer
    # a contiguous tensor's N is as long as any cut needs: no permute
    graph, _ = plan_of(lambda x: x.sum((0, 2, 3)), torch.empty(4096, 8, 16, 16))
    assert "aten.permute" not in graph.describe()


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("op", ["sum", "amax", "mean"])
@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (8, 3, 8, 8)])  # (8, 3, 8, 8): 32 partials of 3 rows, K innermost
def test_dims_cut_as_one_give_eager_results(device, small, channels_last, op, shape):
    x = whole_numbers(*shape, device=device)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    check(lambda x: getattr(x, op)((0, 2, 3)), x)
    check(lambda x: getattr(x, op)((0, 2, 3), keepdim=True) * 2, x)
    check(lambda x: getattr(x, op)((0, 3)), x)


def test_outer_reduction_takes_few_elements_of_many_rows():
    # sum over heads and batch, as a RoPE cos/sin gradient: rows contiguous in memory
    _, plan = plan_of(lambda g: g.sum((0, 1)), torch.randn(2, 4, 64, 16))
    (kernel,) = plan.kernels
    assert kernel.outer and kernel.rblock == 8 and "rows contiguous" in kernel.form
    _, plan = plan_of(lambda x: x.sum(-1), torch.randn(64, 16))
    assert not plan.kernels[0].outer


def test_outer_form_follows_the_layout_not_the_shape():
    # x.t() is [16, 64] with stride (1, 16): summing its last dim walks memory across rows
    _, plan = plan_of(lambda x: x.t().sum(-1), torch.randn(64, 16))
    assert plan.kernels[0].outer


def test_outer_reductions_match_eager(device):
    g = torch.randn(2, 3, 20, 16, device=device)
    check(lambda g: g.sum((0, 1)), g, kernels=1)
    check(lambda g: (g * g).sum((0, 1), keepdim=True).sqrt(), g, kernels=1)
    check(lambda x: x.t().sum(-1), torch.randn(64, 16, device=device), kernels=1)


def test_bias_gradient_in_training(device, small, caplog):
    from minicomp.dispatch.dynamo import backend

    x = torch.randn(512, 6, device=device, requires_grad=True)
    w = torch.randn(5, 6, device=device, requires_grad=True)
    b = torch.randn(5, device=device, requires_grad=True)

    def step(x, w, b):
        return torch.relu(F.linear(x, w, b)).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend)
    with caplog.at_level("INFO", logger="minicomp.fusion"):
        compiled(x, w, b).backward()
    assert "partial results of a split reduction" in caplog.text  # the bias gradient's sum(0)
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    step(x, w, b).backward()
    for a, e in zip(got, [t.grad for t in (x, w, b)]):
        torch.testing.assert_close(a, e)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    dims=st.sets(st.integers(0, 2), min_size=1),
    op=st.sampled_from(["sum", "mean", "amax", "amin"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    keepdim=st.booleans(),
)
def test_split_matches_eager_on_any_shape(shape, dims, op, dtype, keepdim):
    dims = sorted(d for d in dims if d < len(shape))
    if not dims:
        return
    x = whole_numbers(*shape).to(dtype)
    fn = lambda x: getattr(torch, op)(x, dims, keepdim=keepdim)  # noqa: E731
    with config.override(split_min_numel=64, split_chunk=4, split_programs=64, split_below=32):
        check(fn, x)


def test_kernel_count_helper_sees_both_kernels(small):
    source = minicomp.jit(lambda x: x.sum()).source(torch.randn(4096))
    assert kernel_count(source) == 2


def test_explain_shows_the_split_and_why_it_is_two_kernels(small):
    text = str(minicomp.explain(lambda x: x.sum(0), whole_numbers(1024, 8)))
    assert "split 64 ways for sum" in text and "combines the 64 partial results of a split reduction" in text
    assert "rows contiguous" in text  # the outer form of both kernels


def test_a_bias_gradient_a_row_kernel_cannot_take_is_refused_cleanly():
    # Swin's relative position bias: [2, 4, 4] broadcast over a batch of 3 into a softmax; the
    # one-group split of its gradient does not ride in the softmax's row kernel, and the chunks
    # view left there has no place in it. Not yet compiled: the backward is refused at compile
    # time with that reason (it raised StopIteration from codegen) and runs eagerly, right.
    import warnings

    idx = torch.randint(0, 9, (16,), generator=torch.Generator().manual_seed(0))

    def f(table, x):
        bias = table[idx].view(4, 4, 2).permute(2, 0, 1).contiguous()
        return (x + bias.unsqueeze(0)).softmax(-1)

    table, x = torch.randn(9, 2, requires_grad=True), torch.randn(3, 2, 4, 4, requires_grad=True)
    seed = torch.randn(3, 2, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.autograd.grad((minicomp.jit(f, fallback="warn")(table, x) * seed).sum(), (table, x))
    want = torch.autograd.grad((f(table, x) * seed).sum(), (table, x))
    torch.testing.assert_close(got, want)
    assert all("has no place in a reduction kernel" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_few_programs_walking_long_columns_split_though_the_total_is_small():
    """A bias gradient over [8192, 64] (DLRM's bottom MLP) is under split_min_numel, yet unsplit
    its 64 columns were two programs walking 8192 rows each (650 us on an H200): a program that
    would walk at least split_tile_numel elements splits whatever the total."""
    x = torch.zeros(8192, 64, device="meta")
    fn = lambda x: (torch.relu(x) * 2).sum(0)  # noqa: E731
    graph, _ = plan_of(fn, x)
    assert graph.partials  # split
    with config.override(split_tile_numel=1 << 30):
        graph, _ = plan_of(fn, x)
        assert not graph.partials  # the total alone (512K < split_min_numel) would not split it
    rows = torch.zeros(4, 9000, device="meta")  # 4 rows of 9000 (a short cross-entropy): 9000 a program
    graph, _ = plan_of(lambda x: x.sum(1), rows)
    assert not graph.partials
