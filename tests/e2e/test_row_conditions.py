"""Regression (issue #43, transformers' Mamba training step): a reduction kernel's row conditions.

A slice_scatter over the rows of a reduction (a parallel scan's step over the sequence, summed over
the state) or a one-hot scatter covering some of the rows is evaluated at the kernel's full index,
but tests a condition of the rows only, and that condition masks loads read at the rows (a value
broadcast over the reduced dim). The condition was written in the loop body, the loads it masks
before it: the kernel read an unassigned temporary when it ran (UnboundLocalError in the
interpreter). A line now goes where what it reads is defined (codegen/reduction.py `temp`), and
a module that reads a name before assigning it is refused as it is written (codegen/assigned.py).
"""

import warnings

import pytest
import torch
from conftest import check, grads_match

import minicomp
from minicomp import config
from minicomp.codegen import reduction

FORMS = {"persistent": {}, "looped": dict(persistent_rows=8, loop_block=16)}


def scan_step(delta, A, u):
    """One up-sweep step of a parallel scan over the sequence (Mamba's pscan): the odd positions
    take dA * h[even] + h[odd]; h is broadcast over the state dim N."""
    dA = torch.exp(delta.unsqueeze(-1) * A.unsqueeze(1))  # [B, D, L, N]
    h = (delta * u).unsqueeze(-1) * torch.ones_like(A).unsqueeze(1)
    odd = dA[:, :, 1::2] * h[:, :, 0::2] + h[:, :, 1::2]
    return h.slice_scatter(odd, dim=2, start=1, step=2)


def scan_sums(delta, A, u):
    """The scan step summed over the state: the slice_scatter inside a reduction forward too."""
    return scan_step(delta, A, u).sum(-1)


def scatter_rows(x, index):
    """A one-hot scatter that covers 4 of 6 rows, in a softmax's reduction kernel."""
    return torch.softmax(x + torch.zeros_like(x).scatter(1, index, 1.0), -1)


def scan_args(device, dtype, n):
    B, D, L = 2, 3, 8
    make = lambda *shape: torch.randn(*shape, device=device).to(dtype)  # noqa: E731
    return make(B, D, L), (make(D, n).float() * 0.5).to(dtype), make(B, D, L)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scan_step_over_rows_of_a_reduction(device, form, dtype):
    n = 32 if form == "looped" else 4
    with config.override(**FORMS[form]):
        check(scan_sums, *scan_args(device, dtype, n))
        grads_match(scan_sums, *scan_args(device, dtype, n))
        grads_match(scan_step, *scan_args(device, dtype, n))  # the slice_scatter in the backward's sum only


@pytest.mark.parametrize("form", FORMS)
def test_one_hot_scatter_over_some_rows(device, form):
    cols = 32 if form == "looped" else 16
    with config.override(**FORMS[form]):
        x, index = torch.randn(6, cols, device=device), torch.randint(0, cols, (4, 1), device=device)
        check(scatter_rows, x, index)
        grads_match(scatter_rows, x, index, grad_of=[0])


def test_slice_scatter_of_a_broadcast_row(device):
    def fn(a, b):
        return torch.slice_scatter(a * 2, b.expand(4, 16), dim=0, start=1, step=2).sum(-1)

    source = check(fn, torch.randn(8, 16, device=device), torch.randn(4, 1, device=device))
    lines = source.splitlines()
    condition = next(i for i, line in enumerate(lines) if line.strip().startswith("slice_scatter_tmp ="))
    assert condition < next(i for i, line in enumerate(lines) if "mask=xmask & slice_scatter_tmp" in line)


def test_through_torch_compile():
    args = scan_args("cpu", torch.float32, 4)
    eager = [a.clone().requires_grad_() for a in args]
    mine = [a.clone().requires_grad_() for a in args]
    compiled = torch.compile(scan_step, backend="minicomp")
    expected, actual = scan_step(*eager), compiled(*mine)
    torch.testing.assert_close(actual, expected)
    seed = torch.randn_like(expected)
    (expected * seed).sum().backward()
    (actual * seed).sum().backward()
    for a, b in zip(mine, eager):
        torch.testing.assert_close(a.grad, b.grad)


def test_an_unassigned_read_is_refused_at_compile_time(monkeypatch, tmp_path):
    """With the old placement (by the value being evaluated, not by what the line reads), the
    kernel would read the condition before assigning it: the module writer refuses it, and the
    call falls back to eager with the reason, instead of failing inside the kernel."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))  # nothing compiled before: it is written here
    monkeypatch.setattr(reduction.ReductionWriter, "_reads_full", lambda self, code: self.full)
    args = scan_args("cpu", torch.float32, 4)
    with pytest.raises(minicomp.CompileError, match="UnassignedName: generated function .* reads 'slice_scatter"):
        minicomp.jit(scan_sums, fallback="raise")(*args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = minicomp.jit(scan_sums, fallback="warn")(*args)
    torch.testing.assert_close(result, scan_sums(*args))
    assert any("before it is assigned on every path" in str(w.message) for w in caught)
