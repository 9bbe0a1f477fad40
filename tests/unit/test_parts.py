"""Walking a dim in parts at its cat/slice boundaries (codegen/parts.py): each part's choices
are decided in the kernel text, so every element is loaded once and no lane selects."""

import re

import pytest
import torch
import torch.nn.functional as F
import workloads as w
from conftest import check, kernel_text

import minicomp
from minicomp.codegen.parts import Parts, boundary, choose, period
from minicomp.lowering.indexing import Expr, IterationSpace, Var


def loads(source: str) -> list[str]:
    return re.findall(r"tl\.load\(.*", "".join(kernel_text(source)))


def test_boundary_is_where_a_comparison_changes_truth():
    assert boundary(1, 0, ">=", 64) == [64]
    assert boundary(1, 0, "<", 64) == [64]  # the same cut, seen from below
    assert boundary(1, 5, ">=", 64) == [59]  # x + 5 >= 64
    assert boundary(2, 0, ">=", 5) == [3]  # 2x >= 5 from x = 3 on
    assert boundary(-1, 127, ">=", 64) == [64]  # 127 - x >= 64 (a flip) up to x = 63
    assert boundary(1, 0, "==", 3) == [3, 4]


def test_choose_takes_equal_parts_of_the_innermost_dim():
    space = IterationSpace([4, 2, 128])
    assert choose(space, {2: {64}}, {}) == Parts(dim=2, count=2, size=64)
    assert choose(space, {2: {32, 64, 96}}, {}) == Parts(dim=2, count=4, size=32)
    assert choose(space, {2: {48}}, {}) is None  # gcd 16: 8 parts, too many copies of the body
    assert choose(IterationSpace([4, 16]), {1: {8}}, {}) is None  # 8-element runs: too short for full vectors
    assert choose(space, {1: {1}}, {}) == Parts(dim=1, count=2, size=1)  # an outer dim: parts of any size
    assert choose(space, {1: {1}, 2: {64}}, {}).dim == 2  # the innermost wins
    assert choose(space, {2: {0, 128}}, {}) is None  # no cut inside the range


def test_choose_walks_interleaved_parts_where_no_dim_is_cut_into_runs():
    """Periods of parity-like comparisons ((c*x + k) % m): as many interleaved parts as their
    least common multiple, on the innermost such dim; parts in runs win over them."""
    space = IterationSpace([4, 6, 128])
    assert choose(space, {}, {2: {2}}) == Parts(dim=2, count=2, size=64, interleaved=True)
    assert choose(space, {}, {2: {2, 4}}) == Parts(dim=2, count=4, size=32, interleaved=True)
    assert choose(space, {}, {1: {3}, 2: {2}}).dim == 2
    assert choose(space, {}, {1: {3}}) == Parts(dim=1, count=3, size=2, interleaved=True)
    assert choose(space, {}, {2: {3}}) is None  # 3 does not divide 128
    assert choose(space, {}, {2: {2, 3}}) is None  # 6 parts: more than max_parts
    assert choose(space, {2: {64}}, {2: {2}}) == Parts(dim=2, count=2, size=64)  # runs first


def test_period_of_a_remainder():
    x = Expr.of(Var(3, 64))
    assert period(x, 2) == (3, 2)
    assert period(x * 2 + 1, 4) == (3, 2)  # (2x + 1) % 4 repeats every 2 values of x
    assert period(x * 2, 2) is None  # always even
    assert period(x + Expr.of(Var(2, 4)), 2) is None  # two variables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_loads_each_element_once_and_never_selects(device, dtype):
    q, k = (torch.randn(2, 3, 4, 64, device=device, dtype=dtype) for _ in range(2))
    cos, sin = (torch.randn(4, 64, device=device, dtype=dtype) for _ in range(2))
    source = check(w.rope, q, k, cos, sin, kernels=1)
    assert "walked as 2 parts of 32" in source
    # q, k, cos, sin: each half once; no masks beyond the bounds, no tl.where
    assert len(loads(source)) == 8 and all("mask=mask," in line for line in loads(source))
    assert "tl.where" not in "".join(kernel_text(source))


def test_rope_backward_loads_each_element_once(device):
    q, k = (torch.randn(2, 3, 4, 64, device=device, requires_grad=True) for _ in range(2))
    cos, sin = torch.randn(4, 64, device=device), torch.randn(4, 64, device=device)
    fn = minicomp.jit(w.rope)
    oq, ok = fn(q, k, cos, sin)
    (oq * ok).sum().backward()
    backward = fn.entry(q, k, cos, sin).backward.source
    assert "walked as 2 parts of 32" in backward
    assert len(loads(backward)) == 8 and "tl.where" not in "".join(kernel_text(backward))
    eq, ek = (t.detach().requires_grad_() for t in (q, k))
    a, b = w.rope(eq, ek, cos, sin)
    (a * b).sum().backward()
    torch.testing.assert_close((q.grad, k.grad), (eq.grad, ek.grad))


def test_four_parts_of_a_shuffled_cat(device):
    x = torch.randn(3, 5, 128, device=device)
    source = check(lambda x: torch.cat([x[..., 32:64], -x[..., 96:], x[..., :32], x[..., 64:96]], -1) * 2, x, kernels=1)
    assert "walked as 4 parts of 32" in source and len(loads(source)) == 4


def test_padding_part_is_the_constant(device):
    x = torch.randn(4, 32, device=device)
    source = check(lambda x: F.pad(x, (32, 0), value=0.5).exp(), x, kernels=1)
    assert "walked as 2 parts of 32" in source and len(loads(source)) == 1


def test_stack_on_an_outer_dim(device):
    x, y = torch.randn(3, 40, device=device), torch.randn(3, 40, device=device)
    source = check(lambda x, y: torch.stack([x.exp(), y * 2]) + 1, x, y, kernels=1)
    assert "walked as 2 parts of 1" in source and "tl.where" not in "".join(kernel_text(source))


def test_slice_gradient_walks_in_parts(device):
    x = torch.randn(6, 64, device=device, requires_grad=True)
    fn = minicomp.jit(lambda x: x[:, 32:].sin() * x[:, :32])
    fn(x).sum().backward()
    assert "walked as 2 parts of 32" in fn.entry(x).backward.source
    ex = x.detach().requires_grad_()
    (ex[:, 32:].sin() * ex[:, :32]).sum().backward()
    torch.testing.assert_close(x.grad, ex.grad)


@pytest.mark.parametrize("widths", [(48, 80), (24, 8), (64, 64, 64)])
def test_cuts_that_do_not_make_equal_parts_keep_the_masked_form(device, widths):
    """Unequal parts (or 3 parts of a dim of 192 = 3 * 64, a fine cut) stay correct either way."""
    parts = [torch.randn(3, n, device=device) for n in widths]
    source = check(lambda *p: torch.cat([t * (i + 1) for i, t in enumerate(p)], -1).tanh(), *parts, kernels=1)
    assert ("walked as" in source) == (len(set(widths)) == 1)


def test_a_kernel_walked_in_parts_keeps_the_elements_per_program_of_its_config():
    """BLOCK_SIZE counts offsets; each writes `parts` elements. It stays a power of two (tl.arange)."""
    from minicomp.runtime import PointwiseLaunch

    assert [PointwiseLaunch(4096, parts=p).per_part(1024) for p in (1, 2, 3, 4)] == [1024, 512, 256, 256]
    assert PointwiseLaunch(64, parts=4).per_part(32) == 16
