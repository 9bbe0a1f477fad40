"""A backward writes a gradient over a saved activation it reads for the last time, when the
activation's memory is the backward's to take (dispatch/donations.py: AOTAutograd's rule
for donated buffers, and a forward output of memory its own), as Inductor does with donated
buffers. Against eager: the gradients, a second backward under retain_graph (it gets copies),
and a saved value that is also a user output (not taken: the output keeps its values)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicomp.dispatch.dynamo  # noqa: F401  (registers the backend)


def _backward_source(texts: list[str]) -> str:
    return next(t for t in texts if "_backward" in t.splitlines()[0])


def _leaves(*shapes):
    torch.manual_seed(0)
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def _grads(fn, leaves, retain=False):
    for leaf in leaves:
        leaf.grad = None
    fn(*leaves).backward(retain_graph=retain)
    return [leaf.grad.clone() for leaf in leaves]


def test_the_gradient_goes_into_the_saved_product(module_sources):
    def f(x, w):
        return F.gelu(x @ w).sum()

    leaves = _leaves((16, 32), (32, 64))
    got = _grads(torch.compile(f, backend="minicomp"), leaves)
    assert "# in mm's memory: read there, then not again" in _backward_source(module_sources)
    for a, b in zip(got, _grads(f, leaves)):
        torch.testing.assert_close(a, b)


def test_a_second_backward_under_retain_graph_reads_the_saved_values_intact(module_sources):
    def f(x, w):
        return F.gelu(x @ w).sum()

    x, w = _leaves((16, 32), (32, 64))
    loss = torch.compile(f, backend="minicomp")(x, w)
    loss.backward(retain_graph=True)
    first = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    loss.backward()
    for a, b in zip([x.grad, w.grad], first):
        torch.testing.assert_close(a, b)


def test_a_saved_value_the_user_holds_is_not_taken(module_sources):
    def f(x, w):
        product = x @ w
        return F.gelu(product).sum(), product

    x, w = _leaves((16, 32), (32, 64))
    loss, product = torch.compile(f, backend="minicomp")(x, w)
    kept = product.detach().clone()
    loss.backward()
    torch.testing.assert_close(product.detach(), kept)  # the user's tensor keeps its values
    assert "in mm's memory" not in _backward_source(module_sources)


@pytest.mark.parametrize("looped", [False, True])
def test_a_loss_gradient_goes_into_the_saved_logits(module_sources, looped):
    """Cross-entropy's backward: the logits' gradient, one reduction kernel's last-pass store,
    written over the saved logits (the pass reads each element before it stores it), whole rows
    held in registers or walked in passes."""
    from minicomp import config

    def f(h, w, y):
        return F.cross_entropy((h @ w.t()).float(), y)

    h, w = _leaves((16, 32), (100, 32))
    y = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(1))
    with config.override(**({"persistent_rows": 16} if looped else {})):
        got = _grads(lambda h, w: torch.compile(f, backend="minicomp")(h, w, y), [h, w])
    assert "# in mm's memory: read there, then not again" in _backward_source(module_sources)
    for a, b in zip(got, _grads(lambda h, w: f(h, w, y), [h, w])):
        torch.testing.assert_close(a, b)


def test_logits_of_a_three_dim_linear_take_their_gradient(module_sources):
    """A language model's head: [B, S, d] @ W.T viewed as [B*S, V] for the loss. The gradient's
    store (128*x0 + r0) and the saved logits' load (1024*(x0 // 8) + 128*(x0 % 8) + r0) name the
    same elements in two spellings (indexing.py `same_address`)."""

    def f(h, w, y):
        logits = F.linear(h, w)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y)

    h, w = _leaves((2, 8, 32), (128, 32))
    y = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(2))
    got = _grads(lambda h, w: torch.compile(f, backend="minicomp")(h, w, y), [h, w])
    assert "# in mm's memory: read there, then not again" in _backward_source(module_sources)
    for a, b in zip(got, _grads(lambda h, w: f(h, w, y), [h, w])):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("retain", [False, True])
def test_a_padded_products_gradient_goes_into_its_saved_slice(module_sources, retain):
    """BERT's head: logits of an odd vocabulary with a bias, from a padded product saved as its
    slice (plan/pad_matmuls.py). Their gradient is written inside a padded buffer for the two
    gradient matmuls and read by the bias gradient; that buffer is made over the saved product's
    memory (its slice the kernel reads for the last time, at the gradient's addresses). Under
    retain_graph a second backward of the same loss reads the saved values intact."""
    from minicomp import config

    def f(h, w, b, y):
        return F.cross_entropy(F.linear(h, w, b).flatten(0, 1), y)

    leaves = _leaves((2, 3, 16), (37, 16), (37,))
    y = torch.randint(0, 37, (6,), generator=torch.Generator().manual_seed(3))
    want = _grads(lambda *t: f(*t, y), leaves)
    with config.override(pad_matmuls="always"):
        compiled = torch.compile(f, backend="minicomp")
        for _ in range(2):  # a second step: the saved memory of a fresh forward
            for leaf in leaves:
                leaf.grad = None
            loss = compiled(*leaves, y)
            loss.backward(retain_graph=retain)
            if retain:
                for leaf in leaves:
                    leaf.grad = None
                loss.backward()
            for leaf, want_grad in zip(leaves, want):
                torch.testing.assert_close(leaf.grad, want_grad)
    assert "over_or_empty(addmm, " in _backward_source(module_sources)


def test_a_padded_buffer_over_memory_too_small_is_new():
    # the wrapper makes the padded buffer over the donated value's memory only where that memory
    # holds it from its start; else new memory (the donated value untouched)
    from minicomp.runtime import over_or_empty

    def shares(out, base):
        return out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()

    whole = torch.zeros(6, 40)
    assert shares(over_or_empty(whole[:, :37], (6, 40), (40, 1), torch.float32), whole)
    small = torch.zeros(6 * 40 - 3)
    assert not shares(over_or_empty(small.as_strided((6, 37), (40, 1)), (6, 40), (40, 1), torch.float32), small)
    shifted = torch.zeros(6 * 40 + 1)[1:]
    assert not shares(over_or_empty(shifted.as_strided((6, 37), (40, 1)), (6, 40), (40, 1), torch.float32), shifted)
