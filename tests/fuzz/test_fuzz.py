"""The differential fuzzer's fast seed set (CI): each family's first seeds against eager.

The long run is a developer's: `python tests/fuzz/fuzzer.py --cases 20000 --isolate`.

`KNOWN` lists the seeds whose findings are open bugs of the trust issue (#37), by class. The
test asserts the findings are exactly these: a new finding fails it, and so does a fix (then
remove the fixed class's seeds here, and the fix's own regression test takes over).
"""

import fuzzer
import pytest

SEEDS = range(40)
KNOWN = {
    "pointwise": {},
    "views": {},
    "reductions": {},
    "integer": {
        15: "class 2: int8 amax / sum(dtype=int8) compiled like any/all",
        21: "class 2: sum(dtype=torch.int8)",
        23: "class 2: sum(dtype=torch.int8)",
        26: "class 2: sum(dtype=torch.int8)",
    },
    "extern": {
        6: "class 1 / 4: circular pad, then svd's Vh read with meta strides",
        9: "class 1: rfftn of a channels_last input, real strides differ from meta",
        13: "class 1: rfftn / irfft of channels_last values",
        17: "class 1: irfft of a channels_last input",
        29: "class 1: rfftn of a channels_last value",
        34: "class 4: circular pad outside autograd returns uninitialized memory",
    },
}
# seeds beyond the fast set that show a class the fast set does not: the fuzzer finds it
BEYOND = {("views", 74): "class 3: x.view(torch.int32) of float32 values is a bitcast, not a cast"}


@pytest.mark.parametrize("family", fuzzer.FAMILIES)
def test_the_fast_seed_set_finds_only_the_known_bugs(family):
    count, findings, refused = fuzzer.run(SEEDS, family)
    assert count == len(SEEDS) and refused < len(SEEDS) // 2, f"{refused} of {count} cases were not compiled"
    new = [f for f in findings if f.case.seed not in KNOWN[family]]
    assert not new, "\n\n".join(str(f) for f in new)
    fixed = set(KNOWN[family]) - {f.case.seed for f in findings}
    assert not fixed, f"fixed, remove from KNOWN[{family!r}]: {sorted(fixed)}"


@pytest.mark.parametrize(("family", "seed"), list(BEYOND))
def test_the_fuzzer_finds_the_classes_the_fast_set_misses(family, seed):
    finding = fuzzer.check(fuzzer.generate(seed, family))
    assert finding is not None, f"fixed ({BEYOND[family, seed]}): remove it from BEYOND"


def test_cases_are_reproducible_from_their_seed():
    a, b = fuzzer.generate(7, "all"), fuzzer.generate(7, "all")
    assert a.source == b.source and all(x.equal(y) for x, y in zip(a.inputs, b.inputs))
    assert "def f(" in a.repro() and f"case 7 ({a.family}" in a.repro()
