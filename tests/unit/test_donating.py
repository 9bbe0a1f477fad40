"""donating.Donating: a function compiled with an argument's memory given to the call."""

from __future__ import annotations

import pytest
import torch

from minicomp import runtime
from minicomp.dispatch.donating import Donating


def softmax_gradient(logits, weight):
    """(row loss, the loss's gradient for the logits): a [rows, V] result as large as `logits`."""
    lse = torch.logsumexp(logits, dim=1, keepdim=True)
    return lse.squeeze(1), torch.exp(logits - lse) * weight


def _inputs():
    torch.manual_seed(0)
    return torch.randn(6, 300), torch.rand(6, 1)


def test_the_gradient_is_written_over_the_donated_argument():
    logits, weight = _inputs()
    want = softmax_gradient(logits, weight)
    joint = Donating(softmax_gradient, donated=(0,), name="joint", policy="raise")
    first = joint(logits.clone(), weight)  # compiles; runs on a copy of the donated argument
    assert "= reinterpret(donated_0, " in joint.compiled.source
    given = logits.clone()
    second = joint(given, weight)
    for got in (first, second):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert second[1].data_ptr() == given.data_ptr(), "the gradient lives in the donated memory"
    torch.testing.assert_close(given, want[1])  # ... which the call wrote over


def test_a_first_call_that_fails_leaves_the_donated_argument_whole(monkeypatch):
    logits, weight = _inputs()
    kept = logits.clone()

    def failing_load(*args, **kwargs):
        raise RuntimeError("a kernel that does not compile")

    monkeypatch.setattr(runtime, "load", failing_load)
    joint = Donating(softmax_gradient, donated=(0,), name="joint", policy="warn")
    with pytest.warns(UserWarning, match="could not compile joint"):
        got = joint(logits, weight)
    torch.testing.assert_close(logits, kept)
    for g, w in zip(got, softmax_gradient(kept, weight)):
        torch.testing.assert_close(g, w)
    assert joint.run is softmax_gradient  # later calls: the function as written


def test_a_returned_donated_argument_takes_no_donation():
    logits, weight = _inputs()

    def returns_it(logits, weight):
        return logits, logits * weight

    joint = Donating(returns_it, donated=(0,), name="returns_it", policy="silent")
    got = joint(logits, weight)
    assert got[0] is logits and joint.compiled is None
    torch.testing.assert_close(got[1], logits * weight)


def test_a_padded_donated_view_takes_its_gradient_padded():
    """A product padded for cuBLAS comes as a [rows, V] view at row stride Vp: the first call's copy
    keeps that stride (the code reads it there), and the gradient, padded with zero columns, is
    written inside the padded product's memory."""

    def padded_gradient(logits, weight):
        loss, gradient = softmax_gradient(logits, weight)
        return loss, torch.constant_pad_nd(gradient, [0, 4])

    logits, weight = _inputs()
    want = padded_gradient(logits, weight)
    joint = Donating(padded_gradient, donated=(0,), name="padded", policy="raise")
    for _ in range(2):
        product = torch.zeros(6, 304)
        product[:, :300] = logits
        got = joint(product[:, :300], weight)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert got[1].data_ptr() == product.data_ptr(), "the padded gradient lives in the product's memory"
    assert "over_or_empty(donated_0" in joint.compiled.source
