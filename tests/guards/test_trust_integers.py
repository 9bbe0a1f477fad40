"""Issue #37, integer classes: never a wrong result from an integer reduction (2), a bitcast view (3)
or an integer division by zero (13). Each on several dtypes and layouts, through minicomp.jit and
the torch.compile backend (`backend="minicomp"`, the entry point of minicomp.dispatch.dynamo.backend)."""

import pytest
import torch

import minicomp
import minicomp.dispatch.dynamo

INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def _values(dtype, shape, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    low = 0 if dtype == torch.uint8 else -7
    return torch.randint(low, 8, shape, generator=gen).to(dtype).to(device)


def _same(expected, got):
    if isinstance(expected, tuple):
        assert len(expected) == len(got)
        for e, g in zip(expected, got):
            _same(e, g)
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected.cpu()), (expected, got)


# -- 2. integer reductions accumulate values, not truth ------------------------------

REDUCTIONS = {
    "amax_abs": lambda q: q.abs().amax() if q.dtype != torch.uint8 else q.amax(),
    "amax_dim": lambda q: q.amax(-1),
    "amin_dim": lambda q: q.amin(dim=0),
    "argmax": lambda q: q.argmax(dim=-1),
    "argmin_all": lambda q: q.argmin(),
    "aminmax": lambda q: torch.aminmax(q, dim=-1),
    "max_dim": lambda q: q.max(-1),
    "sum_own_dtype": lambda q: q.sum(dtype=q.dtype),
    "sum_int8_wraps": lambda q: q.sum(-1, dtype=torch.int8),
    "sum_default_int64": lambda q: q.sum(-1),
    "prod": lambda q: (q.remainder(3) + 1).prod(-1),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("dtype", INTS)
def test_integer_reductions_match_eager(device, dtype, name):
    fn = REDUCTIONS[name]
    q = _values(dtype, (6, 37), device)
    _same(fn(q), minicomp.jit(fn)(q))


@pytest.mark.parametrize("layout", ["transposed", "looped_row", "whole_tensor_split"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_small_integer_reductions_in_every_kernel_form(device, dtype, layout):
    if layout == "transposed":
        q = _values(dtype, (37, 6), device).t()
    elif layout == "looped_row":
        q = _values(dtype, (3, 5000), device)
    else:
        q = _values(dtype, (1 << 17,), device)

    def fn(q):
        return q.amax(-1), q.amin(-1), q.argmax(-1), q.sum(-1, dtype=dtype)

    _same(fn(q), minicomp.jit(fn)(q))


def test_any_and_all_still_reduce_truth(device):
    q = _values(torch.int8, (6, 37), device)

    def fn(q):
        return q.any(-1), (q > 6).all(), (q == 3).any()

    _same(fn(q), minicomp.jit(fn)(q))


def test_int8_amax_through_the_backend(device):
    q = _values(torch.int8, (4, 33), device)
    fn = torch.compile(lambda q: q.abs().amax(), backend=minicomp.dispatch.dynamo.backend)
    _same(q.abs().amax(), fn(q))


# -- 3. view(dtype) reinterprets the bits ---------------------------------------------

BITCASTS = [
    (torch.float32, torch.int32),
    (torch.int32, torch.float32),
    (torch.float16, torch.int16),
    (torch.bfloat16, torch.int16),
    (torch.bfloat16, torch.float16),
    (torch.float64, torch.int64),
    (torch.int8, torch.uint8),
]


def _floats(dtype, shape, device):
    gen = torch.Generator().manual_seed(1)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 3).to(dtype).to(device)
    if dtype.itemsize > 1:  # the bits of normal floats (a GPU kernel may flush subnormals)
        floats = {2: torch.float16, 4: torch.float32, 8: torch.float64}[dtype.itemsize]
        return (torch.randn(shape, generator=gen) * 3).to(floats).view(dtype).to(device)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype).to(device)


def _same_bits(expected, got):
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
    assert torch.equal(got.cpu().view(width), expected.cpu().view(width))


@pytest.mark.parametrize("source,target", BITCASTS, ids=lambda d: str(d).removeprefix("torch."))
def test_view_dtype_reinterprets_bits_in_kernels(device, source, target):
    x = _floats(source, (5, 8), device)

    def fn(x):
        return (x * 2).view(target) + 1, x.t().view(target) * 1

    for e, g in zip(fn(x), minicomp.jit(fn)(x)):
        _same_bits(e, g)


@pytest.mark.parametrize("layout", ["plain", "sliced", "transposed"])
def test_returned_view_dtype_of_an_argument_is_a_view_of_it(device, layout):
    x = _floats(torch.float32, (4, 6), device)

    def fn(x):
        v = {"plain": x, "sliced": x[1:, 2:], "transposed": x.t()}[layout]
        return v.view(torch.int32)

    expected, got = fn(x), minicomp.jit(fn)(x)
    _same_bits(expected, got)
    assert got.data_ptr() == expected.data_ptr()


def test_view_to_a_dtype_of_another_size_matches_eager(device):
    x = _floats(torch.float32, (4, 6), device)

    def fn(x):
        return (x + 1).view(torch.int16) + 1, x.view(torch.int16)

    for e, g in zip(fn(x), minicomp.jit(fn)(x)):
        _same_bits(e, g)


def test_view_dtype_reduced(device):
    x = _floats(torch.float32, (4, 6), device)

    def fn(x):
        return x.view(torch.int32).sum(-1), x.view(torch.int32).amax()

    _same(fn(x), minicomp.jit(fn)(x))


def test_view_dtype_through_the_backend(device):
    x = _floats(torch.float32, (4, 6), device)
    fn = torch.compile(lambda x: (x + 1).view(torch.int32) + 1, backend=minicomp.dispatch.dynamo.backend)
    _same_bits((x + 1).view(torch.int32) + 1, fn(x))


# -- 13. integer division by zero raises on the CPU, as eager -------------------------

DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor_then_sum": lambda a, b: (a // (b * 1)).sum(-1),
}


@pytest.mark.parametrize("name", list(DIVISIONS))
@pytest.mark.parametrize("dtype", INTS)
def test_integer_division_by_zero_raises_like_eager(dtype, name):
    fn = DIVISIONS[name]
    a = torch.arange(1, 13).to(dtype).reshape(3, 4)
    ones, zero = torch.ones(3, 4, dtype=dtype), torch.ones(3, 4, dtype=dtype)
    zero[1, 2] = 0
    compiled = minicomp.jit(fn)
    _same(fn(a, ones), compiled(a, ones))  # compiled on divisors without a zero
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, zero)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, zero)
    _same(fn(a, ones), compiled(a, ones))  # and still right after


def test_integer_division_by_zero_in_a_transposed_divisor_and_the_backend():
    a = torch.arange(1, 13).reshape(3, 4)
    b = torch.ones(4, 3, dtype=torch.int64)
    compiled = torch.compile(lambda a, b: a % b.t(), backend=minicomp.dispatch.dynamo.backend)
    _same(a % b.t(), compiled(a, b))
    b[3, 0] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, b)


def test_float_and_nonzero_divisions_keep_working():
    a = torch.arange(1, 13).reshape(3, 4)

    def fn(a, b):
        return a // 3, a / b, a.float() // b.float()

    b = torch.zeros(3, 4, dtype=torch.int64)
    _same(fn(a, b), minicomp.jit(fn)(a, b))
