"""Scan kernels (issue #39: a decoding step's position ids are a cumsum of its attention mask):
`cumsum`, `cumprod` and `logcumsumexp` as one Triton kernel each, the scanned value's producers
fused into it, instead of ATen's copy and cub scan kernels (lowering/ops/scans.py, plan/scan.py,
codegen/scan.py). Against eager on random inputs: every dim, layouts, dtypes, rows held whole
and rows walked a tile at a time, training, and through `torch.compile(backend="minicomp")`."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import aten_call, check, grads_match, kernel_count

import minicomp
import minicomp.dispatch.dynamo
from minicomp import config

EXTERN = "cum"  # an ATen cumsum / cumprod (conftest.aten_call)
SCANS = {
    "cumsum": lambda x, d: x.cumsum(d),
    "cumprod": lambda x, d: x.cumprod(d),
    "logcumsumexp": lambda x, d: x.logcumsumexp(d),
}


def _specs(source: str) -> list[str]:
    """The launch spec of each kernel a module launches."""
    return re.findall(r"^launch_\d+ = Launch\(\w+, (\w+)\(", source, flags=re.M)


@pytest.mark.parametrize("op", list(SCANS))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scan_is_one_kernel_with_its_producers(device, op, dim):
    x = torch.rand(5, 7, 6, device=device) + 0.5  # (a product of 5-7 values in [0.5, 1.5): no overflow)
    source = check(lambda x: SCANS[op](x * 1.25 - 0.1, dim), x, kernels=1)
    assert "tl.associative_scan(" in source and "* 1.25" in source and not aten_call(source, EXTERN)
    assert not aten_call(source, "logcumsumexp")


@pytest.mark.parametrize("op", list(SCANS))
def test_rows_longer_than_a_tile_carry_the_tiles_before(device, op):
    # (a product of 300 values: float64, where a float32 one's rounding errors add up past the tolerance)
    x = torch.randn(3, 300, device=device, dtype=torch.float64 if op == "cumprod" else torch.float32)
    with config.override(persistent_rows=64, scan_block=64):
        source = check(lambda x: SCANS[op](x.sin() * 0.01 + (op == "cumprod") + x * (op != "cumprod"), 1), x, kernels=1)
    assert "for roffset in range(0, 300" in source and "carry" in source, source  # (300: its last step apart)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_dtypes(device, dtype):
    """16-bit floats are summed in float32 and rounded once, as eager's CUDA scans do."""
    x = torch.randn(4, 129, device=device).to(dtype)
    source = check(lambda x: x.cumsum(-1) * 2, x)
    assert not aten_call(source, EXTERN)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64, torch.uint8])
def test_integer_cumsum_counts_in_int64(device, dtype):
    x = torch.randint(0, 2 if dtype == torch.bool else 100, (3, 50), device=device).to(dtype)
    source = check(lambda x: x.cumsum(1), x, kernels=1)
    assert not aten_call(source, EXTERN) and "tl.int64" in source


def test_dtype_argument(device):
    x = torch.randint(0, 7, (4, 9), device=device, dtype=torch.int32)
    check(lambda x: torch.cumsum(x, 1, dtype=torch.float32) / 3, x)
    check(lambda x: torch.cumprod(x.float() / 4 + 0.5, 0, dtype=torch.float64), x)


def test_position_ids_from_an_attention_mask(device):
    """What transformers computes for a left-padded batch: the mask's running count, less one,
    padding positions set to 1."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], device=device)

    def fn(mask):
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 1)

    source = check(fn, mask, kernels=2)
    assert not aten_call(source, EXTERN)


def test_layouts(device):
    """A transposed input, a slice of a larger buffer, a broadcast (expanded) value, a dim of one."""
    x = torch.randn(6, 8, device=device)
    check(lambda x: x.t().cumsum(1), x, kernels=1)
    check(lambda x: x[1:5, ::2].cumsum(0), x, kernels=1)
    check(lambda x: x[:1].expand(4, 8).cumsum(0), x, kernels=1)
    check(lambda x: x[:, None].cumsum(1) + 1, x)
    check(lambda x: torch.ones(3, 10, device=x.device).cumsum(1) * x[:3, :1], x)


def test_special_values(device):
    x = torch.tensor([[1.0, float("inf"), 2.0, float("-inf"), 3.0], [float("nan"), 1.0, 0.0, -1.0, 2.0]], device=device)
    for op in SCANS:
        check(lambda x, op=op: SCANS[op](x, 1), x)
    y = torch.tensor([[float("-inf")] * 3 + [0.0], [float("inf"), float("inf"), 1.0, 2.0]], device=device)
    check(lambda y: y.logcumsumexp(1), y)


def test_scan_of_a_reduction_result_waits_a_stage(device):
    """A scan reads a row sum that a reduction kernel writes; a reduction of a scan reads it from memory."""
    x = torch.randn(6, 10, device=device)
    source = check(lambda x: (x - x.mean(1, keepdim=True)).cumsum(1).amax(1), x, kernels=3)
    assert _specs(source) == ["ReductionLaunch"] * 3  # (a scan's launch spec is a reduction's)
    assert "scan (persistent" in source


def test_training(device):
    """cumsum's gradient is a reversed cumsum, cumprod's a ratio of scans: both compiled (float64:
    cumprod's float32 gradient, summed in another order than eager's, moves by ~1e-5)."""
    x = torch.rand(4, 9, device=device, dtype=torch.float64) + 0.5
    entry = grads_match(lambda x: (x.cumsum(1) * x.cumprod(1)).sin(), x)
    assert not aten_call(entry.forward.source, EXTERN) and "tl.associative_scan(" in entry.backward.source
    grads_match(lambda x: x.logcumsumexp(0).cos(), x)


def test_through_dynamo(device):
    x = torch.randn(3, 40, device=device)
    compiled = torch.compile(lambda x: (x.exp().cumsum(-1) + 1).log(), backend=minicomp.dispatch.dynamo.backend)
    torch.testing.assert_close(compiled(x), (x.exp().cumsum(-1) + 1).log())


def test_unsupported_scans_stay_aten_calls(device):
    """A 0-d tensor's scan, an empty one's, an integer logcumsumexp (eager refuses it too)."""
    check(lambda x: x.sum().cumsum(0), torch.randn(3, device=device))
    source = check(lambda x: x[:0].cumsum(1) + 1, torch.randn(3, 4, device=device))
    assert aten_call(source, EXTERN) or kernel_count(source) <= 1


def test_explain_shows_the_scan_kernel(device):
    text = str(minicomp.explain(lambda x: x.cumsum(1), torch.randn(3, 20, device=device)))
    assert "scan over [3, 20] dim 1" in text and "combined by _sum in float32" in text


def test_dtype_argument_rounds_each_element_first(device):
    """`cumsum(x, dtype=float16)` is `x.to(float16).cumsum()`: 1e5 is already inf in float16 (review
    of the scan kind: it was summed in float32, giving [inf, 0, 3] for eager's [inf, nan, nan])."""
    x = torch.tensor([[1e5, -1e5, 3.0], [2.0, 1e-4, 0.5]], device=device)
    check(lambda x: torch.cumsum(x, 1, dtype=torch.float16), x)
    check(lambda x: torch.cumprod(x, 1, dtype=torch.float16), x)
    half = torch.empty(2, 3, dtype=torch.float16, device=device)
    check(lambda x, o: torch.cumsum(x, 1, dtype=o.dtype, out=o), x, half)


@pytest.mark.parametrize("op, shape", [(torch.cumsum, (2, 3)), (torch.sum, (2,))])
def test_out_of_another_dtype_without_dtype_runs_eagerly(device, op, shape):
    """`torch.sum(x, 1, out=half)` sums in half in eager (ATen takes `out`'s dtype where `dtype` is
    unset); torch's functionalization summed in float32 and rounded once ([3, 2.5] for eager's
    [nan, 2.5]; cumsum's on torch 2.11): the call falls back, with the reason, and is right. An
    `out=` of the result's own dtype compiles."""
    x = torch.tensor([[1e5, -1e5, 3.0], [2.0, 1e-4, 0.5]], device=device)

    def f(x, o):
        return op(x, 1, out=o)

    half = torch.empty(shape, dtype=torch.float16, device=device)
    with pytest.warns(UserWarning, match="out= of dtype torch.float16 and no dtype="):
        got = minicomp.jit(f, fallback="warn")(x, half.clone())
    torch.testing.assert_close(got, f(x, half.clone()), equal_nan=True)
    same = torch.empty(shape, device=device)
    torch.testing.assert_close(minicomp.jit(f, fallback="raise")(x, same.clone()), f(x, same.clone()))
    ints = torch.arange(6, dtype=torch.int32, device=device).reshape(2, 3)
    narrow = torch.empty(shape, dtype=torch.int32, device=device)  # summed in int64 and narrowed: eager's
    torch.testing.assert_close(minicomp.jit(f, fallback="raise")(ints, narrow.clone()), f(ints, narrow.clone()))


def test_a_factory_with_out_is_not_run_to_ask_its_dtype(device):
    """The `out=` check asks meta copies of the tensor arguments; a factory has none, so it is not
    asked (it would draw from the generator twice more: review of the check)."""

    def f(o):
        torch.rand(4, out=o)
        return o * 2

    torch.manual_seed(0)
    got = minicomp.jit(f, fallback="raise")(torch.empty(4, dtype=torch.float16, device=device))
    torch.manual_seed(0)
    torch.testing.assert_close(got, f(torch.empty(4, dtype=torch.float16, device=device)))


def test_logcumsumexp_keeps_small_increments(device):
    """log(exp(a) + exp(b)) near 0 is log1p of a tiny exp: `log(1 + tiny)` rounded each step to
    float32's ulp (1.4% low over 600k steps of -20 after a 0, the review found)."""
    x = torch.cat([torch.zeros(1, 1), torch.full((1, 20000), -20.0)], 1).to(device)
    out = minicomp.jit(lambda x: x.logcumsumexp(-1))(x)
    reference = x.double().logcumsumexp(-1)
    torch.testing.assert_close(out.double(), reference, atol=1e-7, rtol=1e-5)


def test_an_argument_named_like_a_combine_helper(device):
    def g(_logaddexp):
        return _logaddexp.logcumsumexp(1)

    check(g, torch.randn(4, 9, device=device), kernels=1)


def test_a_scan_along_an_outer_dim_holds_its_rows_whole(device):
    """Rows contiguous in memory (a scan over dim 0) are held whole as any short row is, not walked
    32 at a time as an outer reduction is."""
    source = check(lambda x: x.cumsum(0), torch.randn(64, 16, device=device), kernels=1)
    assert "scan (persistent, RBLOCK 64)" in source
