"""Lowering of individual ops and type promotion, against eager."""

import pytest
import torch
from conftest import aten_call, check


def rand(*shape, dtype=torch.float32, device="cpu"):
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(0 if dtype == torch.uint8 else -9, 10, shape, device=device, dtype=dtype)
    return torch.randn(shape, device=device, dtype=dtype)


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_div_rounding_modes(device, mode, dtype):
    a = rand(7, 9, dtype=dtype, device=device)
    b = rand(7, 9, dtype=dtype, device=device)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(lambda a, b: torch.div(a, b, rounding_mode=mode), a, b, kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_remainder_and_fmod_follow_the_sign_rules(device, dtype):
    a = rand(33, dtype=dtype, device=device) * 3
    b = rand(33, dtype=dtype, device=device)
    b = torch.where(b == 0, torch.full_like(b, 2), b)
    check(lambda a, b: (a % b, torch.fmod(a, b), a // b), a, b, kernels=1)


def test_unsigned_integers_divide_by_python_ints(device):
    """Regression: `u8 // 3` and `u8 % 3` wrote the 3 as an int32 literal, which Triton refuses to
    divide an unsigned value by: the function ran eagerly. The literal now has the tensor's dtype."""
    a = torch.tensor([0, 3, 250, 7, 255], dtype=torch.uint8, device=device)
    check(lambda a: (a // 3, a % 3, torch.div(a, 4, rounding_mode="trunc"), a + 10, a * 2), a, kernels=1)


def test_alpha_scalars_and_int_to_float_promotion(device):
    i = rand(5, 6, dtype=torch.int32, device=device)
    x = rand(5, 6, device=device)
    check(lambda i, x: (torch.add(i, x, alpha=3), torch.sub(x, i, alpha=0.5), i * 2.5, i / 2, i + 1), i, x, kernels=1)


def test_comparisons_logical_and_where(device):
    x, y = rand(4, 8, device=device), rand(4, 8, device=device)
    m = rand(4, 8, dtype=torch.bool, device=device)
    fn = lambda x, y, m: (
        x > y,
        x <= 0.5,
        torch.logical_and(m, x > 0),
        torch.logical_not(m),  # noqa: E731
        torch.where(m, x, y),
        torch.where(x > 0, x, 1.0),
        torch.logical_xor(m, y < 0),
        ~m,
    )
    check(fn, x, y, m, kernels=1)


def test_clamp_family_propagates_nan(device):
    x = rand(6, 7, device=device)
    x[0, 0] = float("nan")
    lo, hi = rand(6, 7, device=device), rand(6, 7, device=device) + 2
    check(
        lambda x, lo, hi: (
            x.clamp(-0.5, 0.5),
            x.clamp(min=0.1),
            x.clamp(max=0.2),
            torch.clamp(x, lo, hi),
            torch.maximum(x, lo),
            torch.minimum(x, hi),
            torch.relu(x),
        ),
        x,
        lo,
        hi,
        kernels=1,
    )


def test_clamp_min_and_max_with_tensor_bounds(device):
    """clamp_min / clamp_max with tensor bounds (cosine_similarity's eps) fuse, with NaN in the
    operand or in a bound giving NaN and an integer tensor promoted by a float bound, as eager."""
    x = rand(6, 7, device=device)
    x[0, 0] = float("nan")
    lo, hi = rand(6, 1, device=device), rand(7, device=device) + 1
    lo[2, 0] = float("nan")
    n = torch.randint(-5, 5, (6, 7), device=device)
    check(
        lambda x, lo, hi, n: (
            torch.clamp_min(x, lo),
            torch.clamp_max(x, hi),
            torch.clamp_min(n, lo),
            torch.clamp_max(n, torch.tensor(2, device=device)),
            torch.clamp_min(x, 0.25),
        ),
        x,
        lo,
        hi,
        n,
        kernels=1,
    )


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 0.5, -1, 2.7])
def test_pow_with_scalar_exponent(device, exponent):
    x = rand(5, 5, device=device).abs() + 0.1
    check(lambda x: x**exponent, x, kernels=1)


def test_pow_with_tensor_exponent_and_scalar_base(device):
    x, y = rand(5, 5, device=device).abs() + 0.1, rand(5, 5, device=device)
    check(lambda x, y: (x**y, 2**y, 3.0**y), x, y, kernels=1)


def test_integer_pow_with_tensor_exponent_runs_in_aten(device):
    x = rand(5, dtype=torch.int64, device=device)
    e = torch.randint(0, 4, (5,), device=device)
    check(lambda x, e: x**e + 1, x, e)


def test_unary_math(device):
    x = rand(3, 50, device=device) * 0.9
    ops = [
        torch.exp,
        torch.exp2,
        torch.log1p,
        torch.expm1,
        torch.sin,
        torch.cos,
        torch.tan,
        torch.tanh,
        torch.erf,
        torch.sigmoid,
        torch.abs,
        torch.neg,
        torch.floor,
        torch.ceil,
        torch.round,
        torch.trunc,
        torch.sign,
        torch.atan,
        torch.asin,
        torch.sinh,
        torch.frac,
    ]
    check(lambda x: [op(x) for op in ops], x, kernels=1)
    pos = x.abs() + 0.05
    check(lambda x: (x.sqrt(), x.rsqrt(), x.log(), x.log2(), x.log10(), x.reciprocal()), pos, kernels=1)


def test_activations_through_decompositions(device):
    F = torch.nn.functional
    x = rand(4, 33, device=device) * 3
    check(
        lambda x: (
            F.silu(x),
            F.mish(x),
            F.softplus(x),
            F.hardtanh(x),
            F.leaky_relu(x, 0.1),
            F.elu(x),
            F.hardsigmoid(x),
            F.hardswish(x),
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
        ),
        x,
        kernels=1,
    )


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    ],
)
def test_dtypes_and_conversions(device, dtype):
    x = rand(9, 11, dtype=dtype, device=device)
    check(
        lambda x: (x.to(torch.float32) * 2, x.to(torch.int32), x.to(torch.bool), x.to(torch.float16) + 1), x, kernels=1
    )
    if dtype != torch.bool:
        check(lambda x: (x.abs(), -x if dtype != torch.uint8 else x + 1), x, kernels=1)


def test_mixed_precision_promotion(device):
    h, f = rand(8, 8, dtype=torch.float16, device=device), rand(8, 8, device=device)
    check(lambda h, f: (h + f, h * 2, (h + h).float()), h, f, kernels=1)


def test_zero_dim_and_broadcast(device):
    x, s = rand(4, 1, 6, device=device), rand(device=device)
    r = rand(5, 1, device=device)
    check(lambda x, s, r: x * s + r, x, s, r, kernels=1)
    check(lambda s: s.exp() + 1, s, kernels=1)


def test_empty_tensors(device):
    x = rand(0, 5, device=device)
    check(lambda x: x * 2 + 1, x, kernels=0)


def test_non_contiguous_and_expanded_inputs(device):
    base = rand(6, 8, device=device)
    t = base.t()  # transposed view
    s = rand(6, 16, device=device)[:, ::2]  # strided slice
    e = rand(1, 8, device=device).expand(6, 8)
    check(lambda t, s, e: (t.t() + s) * e, t, s, e, kernels=1)
    check(lambda t: t * 2, t, kernels=1)


def test_python_scalars_are_constants_and_defaults_bind(device):
    def scaled(x, scale=2.0, shift=1):
        return x * scale + shift

    x = rand(3, 3, device=device)
    check(scaled, x)
    check(scaled, x, 0.5)
    check(scaled, x, shift=3)


def test_constants_and_factories(device):
    x = rand(4, 5, device=device)
    check(
        lambda x: (
            torch.ones_like(x) * x,
            torch.full((4, 5), 3.0, device=x.device) + x,
            torch.arange(5, device=x.device) * x,
        ),
        x,
        kernels=1,
    )


def test_inplace_ops_mutate_inputs_like_eager(device):
    def fn(x, y):
        x *= 2
        y.addcmul_(x, x, value=0.5)
        return x + 1

    check(fn, rand(4, 4, device=device), rand(4, 4, device=device))


def test_outputs_may_be_any_structure(device):
    x = rand(3, 4, device=device)
    check(lambda x: {"a": x + 1, "b": [x * 2, (x - 1, x)]}, x)
    check(lambda x: x, x, kernels=0)


def test_unsupported_ops_run_in_aten_and_never_crash(device):
    x = rand(5, 7, device=device)
    source = check(lambda x: torch.sort(x * 2, dim=-1).values + 1, x, kernels=2)
    assert aten_call(source, "sort")
    check(lambda x: (x.sum(dim=0) + 1, x.cumsum(1) * 2), x)


def test_every_lowering_rule_is_reachable():
    """A rule whose ATen op the capture's decompositions always rewrite (silu, rsub, transpose,
    the *_backward ops) can never run: such rules are dead code, and this lists them. An op is
    also reached through its in-place form, which a decomposition may leave (cosine_similarity's
    `clamp_min_` on a temporary): capture turns it into the functional op after tracing."""
    from minicomp import capture
    from minicomp.lowering import ops

    decompositions = capture.decompositions()

    def rewritten(packet) -> bool:
        return packet is None or all(getattr(packet, o) in decompositions for o in packet.overloads())

    unreachable = []
    for table in (ops.POINTWISE, ops.VIEWS, ops.INDEXED):
        for name in table:
            packet = getattr(torch.ops.aten, name, None) or getattr(torch.ops.prims, name)
            if rewritten(packet) and rewritten(getattr(torch.ops.aten, f"{name}_", None)):
                unreachable.append(name)
    assert unreachable == []
