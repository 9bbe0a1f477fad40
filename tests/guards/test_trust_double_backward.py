"""Issue #37, class 6 through the torch.compile backend: a double backward (`create_graph=True`,
then a gradient of that gradient) matches eager on every call. AOTAutograd's compiled backward is
not differentiable: it raised AOTAutograd's internal error, or its gradients hung off a dummy
input and the second gradient came back None. (minicomp.jit's: tests/guards/test_trust_modes.py.)"""

import pytest
import torch
import torch.nn.functional as F

import minicomp.dispatch.dynamo

# torch 2.13 builds AOTAutograd's autograd.Function through a factory minicomp reaches; torch 2.11
# (the GPU machine) defines the class inside its compile, which minicomp records as it is made


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend=minicomp.dispatch.dynamo.backend)


def tanh(x):
    return torch.tanh(x).sum()


def softmax(x):
    return (F.softmax(x, -1) * torch.arange(x.shape[-1], device=x.device)).sum()


def layer_norm(x):
    return (F.layer_norm(x, x.shape[-1:]) * x).sum()


def grads(fn, x, params=()):
    """(first, second): the gradient of fn at x (create_graph=True), then of its squared norm
    with respect to x and `params` (None for one it does not depend on, as eager gives)."""
    (first,) = torch.autograd.grad(fn(x), x, create_graph=True)
    second = torch.autograd.grad(first.pow(2).sum(), [x, *params], allow_unused=True)
    return first, second


@pytest.mark.parametrize("fn", [tanh, softmax, layer_norm])
def test_double_backward_through_the_backend(device, fn):
    torch.manual_seed(0)
    fast = compiled(fn)
    for call in range(4):
        x = torch.randn(3, 5, device=device, requires_grad=True)
        got, expected = grads(fast, x), grads(fn, x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_double_backward_of_a_module_through_the_backend(device):
    """A gradient penalty: the parameters' gradient of the input gradient's norm."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    fast = compiled(lambda x: model(x).sum())
    for call in range(4):
        x = torch.randn(5, 4, device=device, requires_grad=True)
        got = grads(fast, x, list(model.parameters()))
        expected = grads(lambda x: model(x).sum(), x, list(model.parameters()))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_double_backward_through_an_input_autograd_computed(device):
    """The graph's input is not a leaf: the second gradient flows on through it."""
    fast = compiled(tanh)
    for call in range(3):
        leaf = torch.randn(3, 5, device=device, requires_grad=True)
        results = []
        for fn in (fast, tanh):
            x = leaf * 2
            (first,) = torch.autograd.grad(fn(x), x, create_graph=True)
            results.append((first, torch.autograd.grad(first.pow(2).sum(), leaf)))
        torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_plain_and_retained_backwards_stay_the_compiled_ones(device):
    """A plain backward, and one with retain_graph=True (which AOTAutograd refused for a graph
    with donated buffers), give eager's gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)
    fast = compiled(lambda x: model(x).pow(2).sum())
    x = torch.randn(5, 4, device=device, requires_grad=True)
    for call in range(3):
        loss = fast(x)
        got = torch.autograd.grad(loss, [x, *model.parameters()], retain_graph=True)
        again = torch.autograd.grad(loss, [x, *model.parameters()])
        expected = torch.autograd.grad(model(x).pow(2).sum(), [x, *model.parameters()])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=f"call {call}")
        torch.testing.assert_close(again, expected, atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_double_backward_refused_in_words_where_a_recomputation_differs(device):
    """A graph that draws random numbers is not run again for create_graph=True: a one-line
    reason, never gradients that silently lose their second-order terms."""
    fast = compiled(lambda x: F.dropout(x.sin(), 0.5).sum())
    for _ in range(3):
        x = torch.randn(8, device=device, requires_grad=True)
        fast(x).backward()  # a plain backward is the compiled one
        with pytest.raises(RuntimeError, match="draws random numbers"):
            torch.autograd.grad(fast(x), x, create_graph=True)
