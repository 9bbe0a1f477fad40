"""16-bit values are compared as eager stores them: rounded to their dtype.

Found by the differential fuzzer (tests/fuzz): the backward of `sin(x).amin(-1)` in bfloat16
recomputes sin in float32 and compares it with the stored, rounded amin; no element was equal,
the count was 0 and every gradient NaN.
"""

import pytest
import torch
from conftest import check, tolerance

import minicomp

LOW = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("reduce", ["amin", "amax"])
def test_gradient_of_an_extremum_of_a_computed_value(device, dtype, reduce):
    """Against eager in the same dtype: ties are decided on the rounded values, so a float32
    reference would disagree wherever rounding makes two elements equal."""
    x = torch.randn(6, 33, device=device, dtype=dtype)
    fn = lambda x: getattr(torch.sin(x), reduce)(dim=-1)  # noqa: E731
    grads = []
    for f in (fn, minicomp.jit(fn)):
        leaf = x.detach().requires_grad_(True)
        f(leaf).float().sum().backward()
        grads.append(leaf.grad)
    assert not grads[1].isnan().any()
    torch.testing.assert_close(grads[1], grads[0], **tolerance(dtype))


@pytest.mark.parametrize("dtype", LOW)
def test_comparisons_of_computed_values_round_first(device, dtype):
    a = torch.randn(257, device=device, dtype=dtype)
    b = a.clone()
    check(lambda a, b: (torch.sin(a) * 3 == torch.sin(b) * 3, torch.exp(a) <= torch.exp(b), torch.tanh(a) > a), a, b)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("to", [torch.int32, torch.int64, torch.uint8])
def test_casts_of_computed_values_to_integers_truncate_the_stored_value(device, dtype, to):
    """`sin(x).to(int)` in 16 bits: eager truncates the rounded sin (0.9999 -> 1.0 -> 1), float32
    would truncate to 0 (found by the fuzzer: views case 8565)."""
    x = torch.linspace(1.2, 1.9, 4096, device=device).to(dtype)
    fn = lambda x: ((torch.sin(x) * 4).to(to), (x * 3.3).to(to))  # noqa: E731
    for got, want in zip(minicomp.jit(fn)(x), fn(x)):
        assert torch.equal(got, want), (got != want).sum()  # exactly: a float32 reference would not do
