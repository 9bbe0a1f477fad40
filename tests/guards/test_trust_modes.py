"""Issue #37, trust under modes: in-place writes into a temporary (circular padding), backward
coverage (a backward minicomp cannot compile, double backward) and grad mode inside a function.
Each compares minicomp with eager, jit and the torch.compile backend."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.conftest import tolerance


def jit(fn):
    return minicomp.jit(fn)


def dynamo(fn):
    return torch.compile(fn, backend="minicomp")


WRAPPERS = [pytest.param(jit, id="jit"), pytest.param(dynamo, id="compile")]


@pytest.fixture
def fallback_warns(monkeypatch):
    """What minicomp refuses runs eagerly with a warning (the suite's policy is "raise")."""
    monkeypatch.setenv("MINICOMP_FALLBACK", "warn")


def quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


# -- 4. in-place copies into a temporary ---------------------------------------------------------
def pad_circular(x):
    return F.pad(x, (1, 2, 2, 1), mode="circular")


def pad_circular_1d(x):
    return F.pad(x, (3, 1), mode="circular") * 2


def fill_slices(x, y):
    t = torch.empty(x.shape[0], x.shape[1] + y.shape[1], dtype=x.dtype, device=x.device)
    t[:, : x.shape[1]] = x
    t[:, x.shape[1] :] = y
    return t + 1


def fill_rows(x):
    t = torch.zeros(x.shape[0] * 2, x.shape[1], dtype=x.dtype, device=x.device)
    t[::2].copy_(x)
    t[1::2] = x.flip(0)
    return t


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "fn,shapes",
    [
        (pad_circular, [(2, 3, 5, 6)]),
        (pad_circular_1d, [(2, 3, 7)]),
        (fill_slices, [(4, 2), (4, 3)]),
        (fill_rows, [(3, 5)]),
    ],
    ids=["pad2d", "pad1d", "slices", "rows"],
)
def test_in_place_into_a_temporary(device, wrap, dtype, fn, shapes):
    torch.manual_seed(0)
    args = [torch.randn(s, device=device, dtype=dtype) for s in shapes]
    compiled = wrap(fn)
    for _ in range(2):
        torch.testing.assert_close(quiet(compiled, *args), fn(*args), **tolerance(dtype))


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_circular_conv_module(device, wrap):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular").to(device)
    x = torch.randn(2, 3, 6, 5, device=device)
    compiled = wrap(conv)
    with torch.no_grad():
        torch.testing.assert_close(quiet(compiled, x), conv(x), atol=1e-4, rtol=1e-4)


def test_circular_pad_trains(device):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6, device=device, requires_grad=True)
    out = quiet(jit(pad_circular), x)
    out.pow(2).sum().backward()
    got, x.grad = x.grad, None
    pad_circular(x).pow(2).sum().backward()
    torch.testing.assert_close(got, x.grad)


# -- 6. backward coverage ------------------------------------------------------------------------
@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("groups", [1, 2])
def test_group_norm_backward(device, wrap, groups, fallback_warns):
    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(groups, 4).to(device)
    compiled = wrap(norm)
    for _ in range(3):
        x = torch.randn(2, 4, 3, 3, device=device, requires_grad=True)
        quiet(compiled, x).pow(2).sum().backward()
        got = (x.grad, norm.weight.grad, norm.bias.grad)
        x.grad = norm.weight.grad = norm.bias.grad = None
        norm(x).pow(2).sum().backward()
        torch.testing.assert_close(got, (x.grad, norm.weight.grad, norm.bias.grad), atol=1e-4, rtol=1e-4)
        norm.weight.grad = norm.bias.grad = None


def test_backward_fallback_warns(device, fallback_warns, monkeypatch):
    """The backward that does not compile says so in one warning, and runs as traced."""
    import minicomp.pipeline

    compile_graph = minicomp.pipeline.compile_graph

    def no_backwards(gm, name="fn", *args, **kwargs):
        if name.endswith("_backward"):
            raise NotImplementedError("a backward this test refuses")
        return compile_graph(gm, name, *args, **kwargs)

    monkeypatch.setattr(minicomp.pipeline, "compile_graph", no_backwards)
    norm = torch.nn.GroupNorm(1, 4).to(device)
    x = torch.randn(2, 4, 3, 3, device=device, requires_grad=True)
    out = minicomp.jit(norm)(x)
    with pytest.warns(UserWarning, match="backward eagerly"):
        out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    norm(x).sum().backward()
    torch.testing.assert_close(grad, x.grad)


def test_group_norm_backward_compiles(device):
    """nn.GroupNorm(1, C)'s backward compiles (it raised a raw NotImplementedError: issue #37)."""
    norm = torch.nn.GroupNorm(1, 4).to(device)
    x = torch.randn(2, 4, 3, 3, device=device, requires_grad=True)
    minicomp.jit(norm, fallback="raise")(x).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    norm(x).sum().backward()
    torch.testing.assert_close(grad, x.grad)


def test_grad_mode_inside_refused(device, fallback_warns):
    x = torch.randn(3, device=device, requires_grad=True)
    with torch.no_grad(), pytest.warns(UserWarning, match="turns grad mode on inside"):
        out = minicomp.jit(enables_grad)(x)
    assert out.requires_grad


def sin_times(x):
    return (x.sin() * x).sum()


def two_inputs(x, w):
    return torch.tanh(x @ w) * x.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn,shapes", [(sin_times, [(5,)]), (two_inputs, [(3, 4), (4, 4)])], ids=["sin", "matmul"])
def test_double_backward(device, fn, shapes):
    torch.manual_seed(0)
    compiled = jit(fn)
    for call in range(4):
        inputs = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
        first = torch.autograd.grad(quiet(compiled, *inputs).sum(), inputs, create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), inputs)
        eager_first = torch.autograd.grad(fn(*inputs).sum(), inputs, create_graph=True)
        eager_second = torch.autograd.grad(sum(g.pow(2).sum() for g in eager_first), inputs)
        torch.testing.assert_close(first, eager_first, atol=1e-5, rtol=1e-5, msg=f"call {call}")
        torch.testing.assert_close(second, eager_second, atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_double_backward_module(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    compiled = jit(model)
    for call in range(3):
        x = torch.randn(5, 4, device=device, requires_grad=True)
        (g,) = torch.autograd.grad(quiet(compiled, x).sum(), x, create_graph=True)
        penalty = torch.autograd.grad(g.pow(2).sum(), model[0].weight)[0]
        (e,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        expected = torch.autograd.grad(e.pow(2).sum(), model[0].weight)[0]
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=f"call {call}")
        torch.testing.assert_close(penalty, expected, atol=1e-5, rtol=1e-5, msg=f"call {call}")


def test_double_backward_refused_where_a_recomputation_differs(device):
    """A forward that draws random numbers is not recomputed for create_graph=True: refused in
    words, never gradients that silently lose the second-order terms."""

    def fn(x):
        return F.dropout(x.sin(), 0.5).sum()

    compiled = jit(fn)
    for _ in range(3):
        x = torch.randn(8, device=device, requires_grad=True)
        compiled(x).backward()  # a plain backward is compiled's
        with pytest.raises(RuntimeError, match="draws random numbers"):
            torch.autograd.grad(compiled(x), x, create_graph=True)


# -- 7. grad mode inside the function ------------------------------------------------------------
def branches_on_grad(x):
    if torch.is_grad_enabled():
        return x * 2
    return x * 3


def enables_grad(x):
    with torch.enable_grad():
        return x * 2 + 1


def sets_grad(x):
    with torch.set_grad_enabled(True):
        y = x.sin()
    return y * x


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("fn", [branches_on_grad, enables_grad, sets_grad])
@pytest.mark.parametrize("grad_mode", [True, False])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_grad_mode_inside(device, wrap, fn, grad_mode, requires_grad, fallback_warns):
    compiled = wrap(fn)
    for _ in range(2):
        x = torch.randn(3, 4, device=device, requires_grad=requires_grad)
        with torch.set_grad_enabled(grad_mode):
            got, expected = quiet(compiled, x), fn(x)
        torch.testing.assert_close(got, expected)
        assert got.requires_grad == expected.requires_grad
        if expected.requires_grad:
            (g,) = torch.autograd.grad(got.sum(), x)
            (e,) = torch.autograd.grad(expected.sum(), x)
            torch.testing.assert_close(g, e)


@pytest.mark.parametrize("frozen", [True, False])
def test_grad_mode_inside_module(device, frozen):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            scale = 2.0 if torch.is_grad_enabled() else 3.0
            return self.linear(x) * scale

    model = Scaled().to(device)
    model.requires_grad_(frozen is False)
    compiled = jit(model)
    x = torch.randn(2, 4, device=device)
    for grad_mode in (False, True, False):
        with torch.set_grad_enabled(grad_mode):
            got, expected = quiet(compiled, x), model(x)
        torch.testing.assert_close(got, expected)
        assert got.requires_grad == expected.requires_grad
