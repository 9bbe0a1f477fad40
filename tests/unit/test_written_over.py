"""Which loads let a reduction kernel's element store write over the buffer they read
(codegen/reduction.py `_same_row`, `ReductionSource.aligned`): a read of the store's own row,
before the pass that writes it, is the program's own; another row's is another program's."""

from __future__ import annotations

import torch

import minicomp
from minicomp import config
from minicomp.codegen.written_over import same_row as _same_row
from minicomp.lowering.indexing import Dyn, Expr, Var

ROW = Var(0, 8)  # 8 rows (dims before 1: the rows)
COL = Var(1, 103)  # of 103 elements
STORE = Expr.of(ROW) * 103 + Expr.of(COL)


def test_a_gather_of_the_rows_own_target_is_in_its_row():
    assert _same_row(Expr.of(ROW) * 103 + Expr.of(Dyn("t", 103, full=False)), STORE, rows=1)
    assert _same_row(STORE, STORE, rows=1)


def test_another_rows_element_is_not():
    assert not _same_row(STORE + 103, STORE, rows=1)  # the next row's element
    assert not _same_row(Expr.of(ROW) * 104 + Expr.of(COL), STORE, rows=1)
    assert not _same_row(Expr.of(Dyn("t", 103, full=False)), STORE, rows=1)  # a row index at run time


def test_an_index_past_the_row_or_at_another_stride_is_not():
    assert not _same_row(Expr.of(ROW) * 103 + Expr.of(Dyn("t", 500, full=False)), STORE, rows=1)
    assert not _same_row(Expr.of(ROW) * 103 + Expr.of(Dyn("t", 50, full=False)) * 2, STORE, rows=1)


def test_a_donated_row_gathered_then_written_over_matches_eager():
    """softmax, the target's probability and a second pass's row sum, the probabilities' double
    written over the donated logits by one kernel: the target's value is read before the pass
    that overwrites its row (before: after it, so the kernel could not write in place)."""
    from minicomp.dispatch.donating import Donating

    def joint(logits, target):
        p = torch.softmax(logits, -1)
        return p.gather(1, target[:, None]).squeeze(1), (logits * p).sum(-1), p * 2.0

    logits, target = torch.randn(6, 40), torch.randint(0, 40, (6,))
    expected = joint(logits.clone(), target)
    with config.override(persistent_rows=16, persistent_bytes=32):  # rows walked in blocks: passes
        fn = Donating(joint, donated=(0,), name="gather_then_write")
        for _ in range(2):  # the first call runs on a copy, the second in place
            got = fn(logits.clone(), target)
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b)
    assert fn.taken  # the probabilities' double written over the logits


def test_a_row_value_stored_early_reads_what_a_later_pass_loaded_first():
    """A row store placed after the pass whose results it needs (amax * s, after pass 1) reads a
    row input (s) that a later pass's store reads first: its load is written before it, not
    reused from that later pass (where the name was not assigned yet: CompileError)."""

    def fn(x, s):
        m = x.amax(-1, keepdim=True)
        q = ((x - m) ** 2).sum(-1, keepdim=True)
        return (x - m) * s / q, (m * s).squeeze(-1)

    x, s = torch.randn(6, 40), torch.randn(6, 1)
    with config.override(persistent_rows=16, persistent_bytes=32):
        got = minicomp.jit(fn, fallback="raise")(x, s)
    for a, b in zip(got, fn(x, s)):
        torch.testing.assert_close(a, b)


def test_a_strided_read_of_the_row_is_not_the_rows_own():
    """A load at twice the row's stride runs past the row (into the next program's)."""
    assert not _same_row(Expr.of(ROW) * 103 + Expr.of(COL) * 2, STORE, rows=1)
