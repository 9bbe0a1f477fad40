"""A dynamic training graph keeps, at every size, what a static one agrees between its forward and
backward (dispatch/sized_contracts.py): the forward leaves a padded product's slice that only the
backward reads uncopied (saved_layouts.py), and the backward writes a gradient over a saved value
it reads for the last time (donations.py). And a slice over a whole dimension, which a symbolic
trace keeps, costs no zeros and copy in the backward (ir/whole_scatters.py). Against eager at each
length: the loss and every gradient; the modules' text for what each compile did."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicomp.dispatch.dynamo  # noqa: F401  (registers the backend)
from minicomp import config

LENGTHS = (6, 7, 9, 5)  # the first compiles a static graph, the second a dynamic one, then a size each


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own graphs (Dynamo's cache keeps an earlier test's for one function)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def always():
    with config.override(pad_matmuls="always"):
        yield


def _leaves():
    torch.manual_seed(0)
    return torch.randn(37, 16, requires_grad=True), torch.randn(37, requires_grad=True)


def _loss(h, w, b, y):
    return F.cross_entropy(F.linear(h, w, b).flatten(0, 1), y.flatten())  # logits [B * S, 37]: padded to 40


def _steps(fn, w, b, retain: bool = False):
    """(loss, h's, w's and b's gradients) at each length."""
    results = []
    for length in LENGTHS:
        g = torch.Generator().manual_seed(length)
        h = torch.randn(2, length, 16, generator=g, requires_grad=True)
        y = torch.randint(0, 37, (2, length), generator=g)
        w.grad = b.grad = None
        loss = fn(h, w, b, y)
        loss.backward(retain_graph=retain)
        if retain:
            first = [h.grad.clone(), w.grad.clone(), b.grad.clone()]
            h.grad = w.grad = b.grad = None
            loss.backward()
            for x, again in zip(first, [h.grad, w.grad, b.grad]):
                torch.testing.assert_close(again, x)
        results.append((loss.detach(), h.grad.clone(), w.grad.clone(), b.grad.clone()))
    return results


def _assert_eagers(got: list, w, b) -> None:
    """Each length's loss and gradients `got` equal eager's."""
    for mine, eager in zip(got, _steps(_loss, w, b)):
        for x, y in zip(mine, eager):
            torch.testing.assert_close(x, y)


def _modules(texts: list[str], role: str) -> list[str]:
    return [t for t in texts if f"_{role}" in t.splitlines()[0]]


def test_each_size_leaves_the_padded_logits_to_its_backward(always, module_sources):
    w, b = _leaves()
    got = _steps(torch.compile(_loss, backend="minicomp"), w, b)
    _assert_eagers(got, w, b)
    backwards = _modules(module_sources, "backward")
    assert len(backwards) == len(LENGTHS)  # the static graph's and one per size of the dynamic one
    for text in backwards:  # the logits' gradient over the saved padded product, at every size
        assert "# in addmm's memory: read there, then not again" in text
    for text in _modules(module_sources, "forward"):
        assert "clone" not in text  # the product's slice is saved as it is, not copied out


def test_a_second_backward_of_a_size_reads_its_saved_values_intact(always):
    w, b = _leaves()
    got = _steps(torch.compile(_loss, backend="minicomp"), w, b, retain=True)
    _assert_eagers(got, w, b)


def test_a_forward_run_as_captured_hands_its_backward_eagers_layout(always, monkeypatch):
    # a size's forward that fails its first call runs as Dynamo captured it (dense logits); its
    # backward, compiled for the padded layout, conforms the value it gets
    from minicomp.dispatch import guarded_calls

    real = guarded_calls.checked_first_call

    def failing_forward(compiled, gm, fail, name):
        run = real(compiled, gm, fail, name)
        if "forward" not in name:
            return run

        def first(args):
            fail(RuntimeError("a first call that fails"))
            return gm(*args)

        first._boxed_call = True
        return first

    monkeypatch.setattr("minicomp.dispatch.dynamo.checked_first_call", failing_forward)  # the static size
    monkeypatch.setattr("minicomp.dispatch.dynamic_graphs.checked_first_call", failing_forward)  # the others
    monkeypatch.setenv("MINICOMP_FALLBACK", "warn")
    w, b = _leaves()
    with pytest.warns(UserWarning, match="a first call that fails"):
        got = _steps(torch.compile(_loss, backend="minicomp"), w, b)
    _assert_eagers(got, w, b)


def test_the_gradient_of_a_whole_slice_is_no_copy(module_sources):
    # h[:, -n:] with n the whole length (transformers' logits_to_keep=0): a dynamic graph keeps
    # the slice, whose gradient was zeros with the gradient scattered over them
    def f(h, w):
        n = h.shape[1]
        return (h.sin()[:, -n:] @ w).tanh().sum()

    torch.manual_seed(0)
    w = torch.randn(16, 8, requires_grad=True)
    compiled = torch.compile(f, backend="minicomp")
    for length in LENGTHS:
        h = torch.randn(2, length, 16, requires_grad=True)
        compiled(h, w).backward()
        got = h.grad.clone()
        h.grad = None
        f(h, w).backward()
        torch.testing.assert_close(got, h.grad)
    backwards = _modules(module_sources, "backward")
    assert len(backwards) == len(LENGTHS)
    for text in backwards:
        assert "slice_scatter" not in text and "aten.full" not in text


def test_each_sizes_backward_writes_into_its_saved_product(module_sources):
    # no padding: the agreement is the donation alone (the product's gradient over the product)
    def f(x, w):
        return F.gelu(x @ w).sum()

    torch.manual_seed(0)
    w = torch.randn(16, 24, requires_grad=True)
    compiled = torch.compile(f, backend="minicomp")
    for length in LENGTHS:
        x = torch.randn(length, 16, requires_grad=True)
        compiled(x, w).backward()
        got = (x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        f(x, w).backward()
        torch.testing.assert_close(got, (x.grad, w.grad))
        w.grad = None
    backwards = _modules(module_sources, "backward")
    assert len(backwards) == len(LENGTHS)
    for text in backwards:
        assert "# in mm's memory: read there, then not again" in text


def test_a_backward_that_fails_after_writing_over_a_saved_value_falls_back_on_it_intact(always, monkeypatch):
    # the module's first call writes the logits' gradient over the donated logits, then fails (a
    # later kernel that does not compile, an extern's mismatch): the captured graph reads the
    # logits, which the first call wrote over a copy of
    from minicomp.dispatch import dynamo

    real = dynamo.compile_graph

    def failing_after_its_writes(gm, name, *args, **kwargs):
        compiled = real(gm, name, *args, **kwargs)
        if "backward" in name and compiled.plan.donated:
            boxed = compiled.boxed

            def writes_then_fails(values):
                boxed(values)
                raise RuntimeError("a later launch fails")

            compiled.boxed = writes_then_fails
        return compiled

    monkeypatch.setattr(dynamo, "compile_graph", failing_after_its_writes)
    monkeypatch.setenv("MINICOMP_FALLBACK", "warn")
    w, b = _leaves()
    with pytest.warns(UserWarning, match="a later launch fails"):
        got = _steps(torch.compile(_loss, backend="minicomp"), w, b)
    _assert_eagers(got, w, b)
