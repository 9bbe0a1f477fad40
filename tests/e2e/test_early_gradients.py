"""A chunked loss whose tail is linear gets its gradients in the forward (issue #41, linear_tail.py).

What reads the region's row results up to the returned scalar decides: a mean, a sum, a weighted
sum by a learnable scale, the count of rows not ignored dividing it are linear (gradients made
in the forward, scaled by the incoming gradient in the backward); a square of the loss, a
per-row result returned, a division by the largest row loss are not (each chunk's product made
again in the backward). A condition on a row's own loss is the region's, not the tail's. Every
case against eager, values and gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minicomp import config
from minicomp.dispatch import chunked_rows, dynamo, linear_tail
from tests.e2e.test_chunked_rows import BUDGET, D, V, _check, _inputs, cuda_step_against_eager


def _mode(fn, *inputs) -> str:
    """Which op the backend put in the forward graph for fn: early, backward, or none."""
    found = []
    compile_graph = dynamo.compile_graph

    def recording(gm, *args, **kwargs):
        found.extend(str(n.target) for n in gm.graph.nodes if "chunked_rows" in str(n.target))
        return compile_graph(gm, *args, **kwargs)

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as patch, config.override(chunk_budget_bytes=BUDGET):
        patch.setattr(dynamo, "compile_graph", recording)
        torch.compile(fn, backend=dynamo.backend)(*inputs)
    if "minicomp.chunked_rows_early.default" in found:
        return "early"
    return "backward" if "minicomp.chunked_rows.default" in found else "none"


def test_a_learnable_scale_of_the_loss():
    """The tail reads a value that needs a gradient of its own (AOTAutograd differentiates the tail)."""
    h, W, y = _inputs()
    scale = torch.tensor(0.7, requires_grad=True)

    def fn(h, W, y):
        return scale * F.cross_entropy(h @ W.T, y) + 0.1 * (W * W).sum()

    assert _mode(fn, h, W, y) == "early"
    _check(fn, (h, W, y))
    ref = torch.autograd.grad(fn(h, W, y), scale)[0]
    with config.override(chunk_budget_bytes=BUDGET):
        got = torch.autograd.grad(torch.compile(fn, backend=dynamo.backend)(h, W, y), scale)[0]
    torch.testing.assert_close(got, ref)


def _squared(h, W, y):
    return F.cross_entropy(h @ W.T, y) ** 2


def _row_losses_too(h, W, y):
    losses = F.cross_entropy(h @ W.T, y, reduction="none")
    return losses.mean(), losses


def _normalized(h, W, y):
    losses = F.cross_entropy(h @ W.T, y, reduction="none")
    return losses.sum() / losses.max()


@pytest.mark.parametrize("fn", [_squared, _row_losses_too, _normalized])
def test_tails_that_are_not_linear(fn):
    h, W, y = _inputs()
    assert _mode(fn, h, W, y) == "backward"
    ref = fn(h, W, y)
    ref = ref[0] if isinstance(ref, tuple) else ref
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(fn, backend=dynamo.backend)(h, W, y)
        out = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(out, [h, W])
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref, [h, W])):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_condition_per_row_is_the_regions():
    """A row's loss clipped by a condition on itself is the region's (per row): the tail, a mean,
    stays linear."""

    def fn(h, W, y):
        losses = F.cross_entropy(h @ W.T, y, reduction="none")
        return torch.where(losses > 4.0, 0.0, losses).mean()

    h, W, y = _inputs()
    assert _mode(fn, h, W, y) == "early"
    _check(fn, (h, W, y))


def test_every_row_ignored():
    """The weights are all zero: the gradients are eager's (zeros), not 0/0."""
    h, W, y = _inputs()
    y = torch.full_like(y, -100)

    def fn(h, W, y):
        return F.cross_entropy(h @ W.T, y, reduction="sum")

    assert _mode(fn, h, W, y) == "early"
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        grads = torch.autograd.grad(torch.compile(fn, backend=dynamo.backend)(h, W, y), [h, W])
    for got, want in zip(grads, torch.autograd.grad(fn(h, W, y), [h, W])):
        torch.testing.assert_close(got, want)


def test_retain_graph_and_accumulation():
    """Two backwards over one forward (retain_graph) and gradients accumulated over two steps give
    eager's: the backward's scaling does not spoil the saved gradients."""
    h, W, y = _inputs()

    def fn(h, W, y):
        return F.cross_entropy(h @ W.T, y, label_smoothing=0.1)

    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        compiled = torch.compile(fn, backend=dynamo.backend)
        out = compiled(h, W, y)
        first = torch.autograd.grad(out, W, torch.tensor(2.0), retain_graph=True)[0]
        second = torch.autograd.grad(out, W, torch.tensor(0.5))[0]
        for _ in range(2):
            compiled(h, W, y).backward()
    ref = torch.autograd.grad(fn(h, W, y), W)[0]
    torch.testing.assert_close(first, 2 * ref)
    torch.testing.assert_close(second, 0.5 * ref)
    torch.testing.assert_close(W.grad, 2 * ref)
    torch.testing.assert_close(h.grad, 2 * torch.autograd.grad(fn(h, W, y), h)[0])


def test_no_gradient_wanted_makes_none(monkeypatch):
    """Under no_grad the forward computes the results alone (no gradient matmuls)."""
    h, W, y = _inputs()
    made = []
    monkeypatch.setattr(chunked_rows.Region, "tail_weights", lambda *a: made.append(1))
    with torch.no_grad():
        assert _mode(lambda h, W, y: F.cross_entropy(h @ W.T, y), h, W, y) == "backward"
    assert not made


def test_linear_rules():
    """Per op: linear in the results, or why not."""
    graph = torch.fx.Graph()
    r, c = graph.placeholder("r"), graph.placeholder("c")
    for node, value in ((r, torch.zeros(4)), (c, torch.ones(4))):
        node.meta["val"] = value
    aten = torch.ops.aten

    def made(target, *args, **kwargs):
        node = graph.call_function(target, args, kwargs)
        node.meta["val"] = torch.zeros(4)
        return node

    derived = {r}
    assert linear_tail._linear(made(aten.mul.Tensor, r, c), derived)
    assert not linear_tail._linear(made(aten.mul.Tensor, r, r), derived)
    assert linear_tail._linear(made(aten.div.Tensor, r, c), derived)
    assert not linear_tail._linear(made(aten.div.Tensor, c, r), derived)
    assert not linear_tail._linear(made(aten.div.Tensor_mode, r, c, rounding_mode="floor"), derived)
    assert linear_tail._linear(made(aten.where.self, c, r, c), derived)
    assert not linear_tail._linear(made(aten.where.self, r, c, c), derived)
    assert not linear_tail._linear(made(aten.exp.default, r), derived)
    assert linear_tail._linear(made(aten.sum.default, r), derived)


@pytest.mark.parametrize("fn", ["mean", "none"])
def test_chunks_padded_for_the_library(fn, monkeypatch):
    """A product whose rows are not 16 bytes long (V = 103 float32) is made by a weight with zero
    columns up to 104 (config "pad_matmuls"; on CUDA by default), and h's gradient from the product's
    gradient with zero columns too (its K padded); the same values in either mode."""
    h, W, y = _inputs()
    widths = []
    mm = torch.mm

    def recording(x, other, **kwargs):
        if x.shape[0] <= 8:  # a chunk's products: N (the forward's), K (h's gradient)
            widths.append((other.shape[1], x.shape[1]))
        return mm(x, other, **kwargs)

    monkeypatch.setattr(torch, "mm", recording)
    with config.override(pad_matmuls="always"):
        _check(lambda h, W, y: F.cross_entropy(h @ W.T, y, reduction=fn), (h, W, y))
    assert (104, D) in widths and (D, 104) in widths
    assert not any(V in pair for pair in widths)


@pytest.mark.gpu
def test_cuda_odd_vocabulary():
    """On CUDA: bf16 [1024, 256] @ [32003, 256] (rows padded to 32008 for cuBLAS), cross-entropy of
    the float32 logits, against eager; gradients made in the forward by minicomp.jit's regions; the
    step's peak above its inputs and gradients under the bf16 logits' bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    n, d, v = 1024, 256, 32003

    def fn(h, W, y):
        return F.cross_entropy((h @ W.T).float(), y)

    with config.override(chunk_budget_bytes=16 << 20):
        assert _mode(*_on_cuda(fn, n, d, v)) == "early"
    peak = cuda_step_against_eager(fn, n, d, v) - (n * d + v * d) * 2  # less the gradients
    assert peak < n * v * 2, f"peak {peak / 2**20:.0f} MiB"


def test_a_padded_bias():
    """A linear's bias gets the weight's zero columns too (V = 103 float32 padded to 104)."""
    h, W, y = _inputs()
    bias = torch.randn(V, requires_grad=True)
    with config.override(pad_matmuls="always"):
        _check(lambda h, W, y: F.cross_entropy(F.linear(h, W, bias), y), (h, W, y))


def _on_cuda(fn, n: int, d: int, v: int) -> tuple:
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.randn(v, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return fn, h, W, torch.randint(0, v, (n,), device="cuda")


@pytest.mark.parametrize("over", [True, False])
def test_gradients_scaled_over_themselves(over, module_sources, monkeypatch):
    """The backward writes the scaled gradients over the saved ones (donated), and allocates new
    ones where a CUDA graph replays the forward (`results_over_donated` off: the next replay would
    write over the gradient a caller holds)."""
    compile_graph = dynamo.compile_graph

    def forced(gm, *args, **kwargs):
        if "results_over_donated" in kwargs:
            kwargs["results_over_donated"] = over
        return compile_graph(gm, *args, **kwargs)

    monkeypatch.setattr(dynamo, "compile_graph", forced)
    h, W, y = _inputs()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(lambda h, W, y: F.cross_entropy(h @ W.T, y), backend=dynamo.backend)(h, W, y)
        grads = torch.autograd.grad(out, [h, W], torch.tensor(3.0))
    backward = next(t for t in module_sources if "tangents_1" in t)
    over_saved = [
        line for line in backward.splitlines() if "= reinterpret(" in line and "'s memory: read there" in line
    ]
    assert bool(over_saved) == over
    for got, want in zip(grads, torch.autograd.grad(F.cross_entropy(h @ W.T, y), [h, W], torch.tensor(3.0))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_double_backward_is_refused():
    """Regression: create_graph=True through a loss whose gradients were made in the forward gave a
    second derivative 0.05 off (the saved gradients hold no graph back to h and W); now a one-line
    error, at the first backward."""
    h, W, y = _inputs()
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(lambda h, W, y: F.cross_entropy(h @ W.T, y), backend=dynamo.backend)(h, W, y)
        with pytest.raises(RuntimeError, match="gradients in the forward, which are not differentiable"):
            torch.autograd.grad(out, h, create_graph=True)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_tails_weights_are_traced_once_and_follow_the_targets(compiled, monkeypatch, own_regions):
    """The weights the tail gives the row losses (1 / the rows not ignored, 0 at an ignored one)
    come from a function traced once per layout of the tail's inputs, not from autograd at every
    call; a call with other targets gets their weights (compiled: minicomp.jit's kernel, in
    Triton's interpreter)."""
    monkeypatch.setattr(chunked_rows, "COMPILE_ON_CPU", compiled)
    h, W, y = _inputs()
    other = y.clone()
    other[:9] = -100  # more rows ignored: other weights
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        fn = torch.compile(lambda h, W, y: F.cross_entropy(h @ W.T, y, ignore_index=-100), backend=dynamo.backend)
        for target in (y, other, y):
            out = fn(h, W, target)
            ref = F.cross_entropy(h @ W.T, target, ignore_index=-100)
            torch.testing.assert_close(out, ref)
            got, want = torch.autograd.grad(out, [h, W]), torch.autograd.grad(ref, [h, W])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            if target is other:  # traced by now: the forward runs no autograd
                calls = []
                monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(a))
                fn(h, W, target)
                monkeypatch.undo()
                monkeypatch.setattr(chunked_rows, "COMPILE_ON_CPU", compiled)
                assert calls == []
    assert [len(r.weight_fns) for r in own_regions.values()] == [1]
