"""A kernel's own combine function under Triton's interpreter (runtime/interpreter_reduce.py):
reductions and scans combined as trees give what the element-by-element loop gives, in order
(non-commutative combines, argmax's first index on ties), on any row length, masked or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton import knobs

from minicomp.runtime import interpreter_reduce


@triton.jit
def _last_nonzero(a, b):  # associative, not commutative
    return tl.where(b != 0, b, a)


@triton.jit
def _first_max(va, ia, vb, ib):  # argmax: the earlier index where values tie
    later = vb > va
    return tl.where(later, vb, va), tl.where(later, ib, ia)


def _kernel():
    @triton.jit
    def combine_rows(x_ptr, last_ptr, best_ptr, scan_ptr, R: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, BLOCK)[None, :]
        mask = cols < R
        x = tl.load(x_ptr + rows * R + cols, mask=mask, other=0.0)
        tl.store(last_ptr + tl.arange(0, ROWS), tl.reduce(x, 1, _last_nonzero))
        _, best = tl.reduce((tl.where(mask, x, float("-inf")), cols + rows * 0), 1, _first_max)
        tl.store(best_ptr + tl.arange(0, ROWS), best)
        tl.store(scan_ptr + rows * R + cols, tl.associative_scan(x, 1, _last_nonzero), mask=mask)

    return combine_rows


@pytest.mark.parametrize("length", [1, 5, 8, 13])
def test_a_tree_combines_as_the_loop_does(length):
    interpreter_reduce.enable()
    with knobs.runtime.scope():
        knobs.runtime.interpret = True
        kernel = _kernel()
        rows = 4
        x = torch.randint(-2, 3, (rows, length)).float()  # zeros and ties among the values
        last, best = torch.empty(rows), torch.empty(rows, dtype=torch.int32)
        scanned = torch.empty(rows, length)
        kernel[(1,)](x, last, best, scanned, R=length, ROWS=rows, BLOCK=triton.next_power_of_2(length))
    values = x.numpy()
    for r in range(rows):
        nonzero = np.flatnonzero(values[r])
        assert last[r] == (values[r][nonzero[-1]] if nonzero.size else 0)
        assert best[r] == int(np.argmax(values[r]))  # (numpy's argmax: the first on ties)
        so_far = [
            values[r][np.flatnonzero(values[r][: i + 1])[-1]] if values[r][: i + 1].any() else 0 for i in range(length)
        ]
        np.testing.assert_array_equal(scanned[r].numpy(), so_far)


@triton.jit
def _max_by_branch(a, b):  # valid Triton: a branch on the values (scf.if inside the reduction)
    if a > b:
        r = a
    else:
        r = b
    return r


def test_a_combine_that_branches_on_its_values_runs_element_by_element():
    interpreter_reduce.enable()
    with knobs.runtime.scope():
        knobs.runtime.interpret = True

        @triton.jit
        def branchy(x_ptr, out_ptr, scan_ptr, N: tl.constexpr):
            x = tl.load(x_ptr + tl.arange(0, N))
            tl.store(out_ptr, tl.reduce(x, 0, _max_by_branch))
            tl.store(scan_ptr + tl.arange(0, N), tl.associative_scan(x, 0, _max_by_branch))

        x = torch.tensor([5.0, 0, 3, 1, 2, 6, 4, 0])
        out, scanned = torch.empty(1), torch.empty(8)
        branchy[(1,)](x, out, scanned, N=8)
    assert out.item() == 6
    np.testing.assert_array_equal(scanned.numpy(), [5, 5, 5, 5, 5, 6, 6, 6])
