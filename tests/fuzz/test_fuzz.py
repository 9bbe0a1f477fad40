"""The differential fuzzer's fast seed set (CI): each family's first seeds against eager.

The long run is a developer's: `python tests/fuzz/fuzzer.py --cases 20000 --isolate`.

`KNOWN` lists the seeds whose findings are open bugs, by class (none today). The test asserts
the findings are exactly these: a new finding fails it, and so does a fix (then remove the fixed
seeds, and the fix's own regression test takes over).
"""

import fuzzer
import pytest

SEEDS = range(40)
KNOWN: dict[str, dict[int, str]] = {family: {} for family in fuzzer.FAMILIES}
# Found by this fast set before the trust fixes (seeds 0-39): integer 15, 21, 23, 26 (class 2:
# int8 amax and sum(dtype=int8) reduced like any/all); extern 9, 13, 17, 29 (class 1: FFT and
# svd outputs read with meta strides), 6 and 34 (class 4: circular pad's writes into a temporary
# dropped). Each fix has its regression tests in tests/guards/test_trust_*.py.


@pytest.mark.parametrize("family", fuzzer.FAMILIES)
def test_the_fast_seed_set_finds_only_the_known_bugs(family):
    count, findings, refused = fuzzer.run(SEEDS, family)
    assert count == len(SEEDS) and refused < len(SEEDS) // 2, f"{refused} of {count} cases were not compiled"
    new = [f for f in findings if f.case.seed not in KNOWN[family]]
    assert not new, "\n\n".join(str(f) for f in new)
    fixed = set(KNOWN[family]) - {f.case.seed for f in findings}
    assert not fixed, f"fixed, remove from KNOWN[{family!r}]: {sorted(fixed)}"


def test_cases_are_reproducible_from_their_seed():
    a, b = fuzzer.generate(7, "all"), fuzzer.generate(7, "all")
    assert a.source == b.source and all(x.equal(y) for x, y in zip(a.inputs, b.inputs))
    assert "def f(" in a.repro() and f"case 7 ({a.family}" in a.repro()


def test_an_output_eager_itself_cannot_hold_is_not_a_finding_and_a_wrong_one_is():
    """Case 47064 of the long run: `svd(...).Vh` of a matrix with two equal columns (circular
    padding): its null-space row turns wholesale when an input moves by an ulp, in eager too. Such
    elements are not judged; an element eager holds steady still is."""
    import torch

    lines = [
        "t0 = torch.log1p(torch.abs(F.pad(x0, (1, 1), mode='circular') * 2))",
        "t1 = torch.linalg.svd(t0, full_matrices=False).Vh.abs() * 2",
    ]
    x = torch.randn(1, 8, 7, generator=torch.Generator().manual_seed(0))
    case = fuzzer.Case(0, "extern", False, [x], ["x0"], lines, ["t1"])
    want = fuzzer._eager(case.source, case.inputs)[0]
    null_row = want.clone()
    null_row[0, -1] = null_row[0, -1].flip(0)  # the null-space row changed: a nudge changes it in eager too
    moved = fuzzer._ill_conditioned(case, 0, null_row, want, 1e-4)
    steady = want.clone()
    steady[0, 0, 0] += 1.0  # the largest singular vector: eager keeps it under a nudge
    assert moved and not fuzzer._ill_conditioned(case, 0, steady, want, 1e-4)


def test_a_gradient_through_16_bit_values_is_judged_at_their_precision():
    """Case 56945 of the long run: float32 inputs cast to float16 inside; eager's backward rounds
    each gradient to 16 bits, minicomp once (closer to float64), and the gradient was judged at
    float32's tolerance."""
    import torch

    x = torch.randn(5, 3, 4, 5, generator=torch.Generator().manual_seed(0)).to(memory_format=torch.channels_last)
    lines = ["t0 = x0.to(torch.float16)", "t1 = torch.sin(t0)", "t2 = torch.abs(t0)"]
    assert fuzzer.check(fuzzer.Case(0, "reductions", True, [x], ["x0"], lines, ["t1", "t2"])) is None


def test_a_gradient_nearer_float64_than_eagers_is_not_a_finding():
    """Case 70017 of the long run: the gradient of a float16 `prod(-1)`; eager's backward divides
    rounded values, minicomp (rounding once) was nearer the float64 gradient (0.1313 against
    0.1300, eager 0.1194) and was reported. Gradients are now judged against float64 as outputs
    are: no worse than eager."""
    assert fuzzer.check(fuzzer.generate(70017)) is None


def test_the_sign_of_a_nan_is_not_judged():
    """Case 101437 of the GPU machine's run: `copysign(x, var(empty))` copies the sign of a NaN,
    which IEEE 754 leaves unspecified (eager's empty var is a positive NaN, x86's 0 / 0 a negative
    one); the magnitudes are still judged."""
    assert fuzzer.check(fuzzer.generate(101437)) is None
    import torch

    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    case = fuzzer.Case(
        0,
        "reductions",
        False,
        [x, torch.empty(0)],
        ["x0", "x1"],
        ["t0 = x1.var(dim=-1)", "t1 = torch.copysign(x0, t0)"],
        ["t1"],
    )
    assert fuzzer._nan_signed(case)
    case = fuzzer.Case(0, "reductions", False, [x], ["x0"], ["t0 = torch.copysign(x0, x0 - 1)"], ["t0"])
    assert not fuzzer._nan_signed(case)  # no NaN: the sign is judged


def test_an_integer_at_a_rounding_boundary_is_not_a_finding():
    """Case 109173 of the GPU machine's run: `log1p(exp(x)).to(int32)` of bfloat16 x. Eager rounds
    exp to bfloat16 (log1p 0.9961 -> 0), minicomp rounds once at the store (0.9986 -> 1.0 -> 1);
    an ulp of x moves eager's own output there. An integer eager holds steady is still judged."""
    assert fuzzer.check(fuzzer.generate(109173)) is None
    case = fuzzer.generate(109173)
    want = fuzzer._eager(case.source, case.inputs)[0]
    wrong = want.clone()
    wrong[(0,) * wrong.ndim] += 5  # not near any boundary of eager's
    assert not fuzzer._ill_conditioned(case, 0, wrong, want, 0.0)
