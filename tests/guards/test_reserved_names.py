"""A value named like something generated code defines never shadows it.

Found by the differential fuzzer (tests/fuzz): an argument named `x0` is also the name of
dim 0's index in a kernel, so `x0 = tl.load(x0_ptr + x0)` replaced the index with the
values and the store wrote wherever they pointed (garbage results, then a corrupted heap).
"""

import pytest
import torch
from conftest import check

import minicomp
from minicomp.ir import is_reserved

# index variables, pointers, kernel and launch names, combine helpers, template locals
NAMES = ["x0", "x1", "r0", "xindex", "rmask", "offsets", "mask", "n_elements", "a_ptr", "_sum", "launch_0", "RBLOCK"]
NAMES += ["out", "out1"]


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


def test_an_input_named_out_written_in_place_computes_as_eager(device):
    """`out` points through `out_ptr`, which is also the name of a kernel's output: a kernel that
    reads and writes `out` declared `out_ptr` twice (a SyntaxError: the call ran eagerly)."""

    def add_into(out, x):
        out.add_(x)
        return out * 2

    out, x = torch.zeros(4, device=device), torch.ones(4, device=device)
    jitted = minicomp.jit(add_into, fallback="raise")
    for step in range(1, 3):
        torch.testing.assert_close(jitted(out, x), torch.full((4,), 2.0 * step, device=device))
    torch.testing.assert_close(out, torch.full((4,), 2.0, device=device))


def test_reserved_names_cover_what_kernels_define():
    assert all(is_reserved(n) for n in NAMES)
    assert not any(is_reserved(n) for n in ["x", "xa", "x0_v", "weight", "ptr", "rope_cache"])
