"""A value named like something generated code defines never shadows it.

Found by the differential fuzzer (tests/fuzz): an argument named `x0` is also the name of
dim 0's index in a kernel, so `x0 = tl.load(x0_ptr + x0)` replaced the index with the
values and the store wrote wherever they pointed (garbage results, then a corrupted heap).
"""

import pytest
import torch
from conftest import check

from minicomp.ir import is_reserved

# index variables, pointers, kernel and launch names, combine helpers, template locals
NAMES = ["x0", "x1", "r0", "xindex", "rmask", "offsets", "mask", "n_elements", "a_ptr", "_sum", "launch_0", "RBLOCK"]


def _function(name: str, body: str):
    scope = {"torch": torch}
    exec(f"def f({name}, other):\n    return {body}\n", scope)  # noqa: S102 - the name is the test's
    return scope["f"]


@pytest.mark.parametrize("name", NAMES)
def test_an_argument_named_like_an_index_or_a_pointer_computes_as_eager(device, name):
    a = torch.randint(-7, 8, (3, 8), device=device)
    b = torch.randn(3, 8, device=device)
    check(_function(name, f"(({name} // -4).abs(), {name}.float() * other + 1)"), a, b)


@pytest.mark.parametrize("name", ["x0", "r0", "x1", "rindex"])
def test_a_reduction_over_an_argument_named_like_its_indexes_computes_as_eager(device, name):
    x = torch.randn(4, 33, device=device)
    check(_function(name, f"torch.softmax({name} * 2, dim=-1) + other.sum(0)"), x, torch.randn(4, 33, device=device))


def test_reserved_names_cover_what_kernels_define():
    assert all(is_reserved(n) for n in NAMES)
    assert not any(is_reserved(n) for n in ["x", "xa", "x0_v", "weight", "ptr", "rope_cache"])
