"""Padded matmuls (plan/pad_matmuls.py): misaligned sizes padded with zeros, results eager's.

On the CPU the rewrite runs with pad_matmuls="always" (no timing); on a GPU, "auto" times both
forms (runtime/matmul_timing.py). Every result is compared with eager, its layout too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import check, grads_match, graph_of, ops_of

import minicomp
from minicomp import config
from minicomp.plan import fusion
from minicomp.plan.pad_matmuls import pad_matmuls


@pytest.fixture
def always():
    with config.override(pad_matmuls="always"):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda a, b: a @ b, [(6, 13), (13, 37)]),  # M, K, N all misaligned
        (lambda a, b: a @ b.t(), [(6, 13), (37, 13)]),  # b a transposed weight: padded through the permute
        (lambda a, b: a.t() @ b, [(13, 37), (13, 6)]),  # a column-major: M is its leading dim
        (lambda a, b: torch.bmm(a, b), [(3, 5, 11), (3, 11, 7)]),
        (lambda a, b: (a @ b).relu() * 2, [(6, 13), (13, 37)]),  # read by a kernel through the padded stride
        (lambda a, b: (a @ b).view(-1), [(6, 13), (13, 37)]),  # a view ATen could not take of the strided slice
        (lambda a, b: (a @ b) @ b.t(), [(6, 13), (13, 37)]),  # the product read by another matmul
    ],
)
def test_padded_matmuls_match_eager(device, dtype, fn, shapes, always):
    args = [torch.randn(s, device=device).to(dtype) for s in shapes]
    source = check(fn, *args)
    assert "padded" in source


@pytest.mark.parametrize("bias_shape", [(37,), (6, 37), (1, 37), (6, 1)])
def test_addmm_bias_is_padded_where_it_spans_the_padded_sizes(device, bias_shape, always):
    a, b, bias = (
        torch.randn(6, 13, device=device),
        torch.randn(13, 37, device=device),
        torch.randn(bias_shape, device=device),
    )
    check(lambda bias, a, b: torch.addmm(bias, a, b, beta=0.5, alpha=2.0), bias, a, b)


def test_linear_training_step_matches_eager(device, always):
    # the vocabulary projection of a language model: weight [V, D] with V odd, and its two gradients
    h, w, bias = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device), torch.randn(37, device=device)
    y = torch.randint(0, 37, (6,), device=device)
    entry = grads_match(lambda h, w, bias: F.cross_entropy(F.linear(h, w, bias), y), h, w, bias)
    assert entry is not None


def test_returned_product_has_eagers_layout(always):
    a, b = torch.randn(6, 13), torch.randn(13, 37)
    out = minicomp.jit(lambda a, b: a @ b)(a, b)
    assert out.stride() == (37, 1)
    torch.testing.assert_close(out, a @ b)


def test_through_the_backend(always):
    w = torch.randn(37, 13, requires_grad=True)
    x = torch.randn(6, 13, requires_grad=True)
    fn = lambda x, w: (x @ w.t()).tanh().sum()  # noqa: E731
    compiled = torch.compile(fn, backend="minicomp")
    got = compiled(x, w)
    gx, gw = torch.autograd.grad(got, (x, w))
    want = fn(x, w)
    ex, ew = torch.autograd.grad(want, (x, w))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)


def test_two_uses_of_one_value_share_its_padded_copy(always):
    # the gradient of the logits is the K operand of dh and (transposed) the M operand of dW
    g, w, h = torch.randn(6, 37), torch.randn(37, 16), torch.randn(6, 16)
    graph = pad_matmuls(graph_of(lambda g, w, h: (g @ w, g.t() @ h), g, w, h))
    pads = [graph[n] for n in graph.order if graph[n].op_name == "constant_pad_nd"]
    assert sorted(p.args[0].name for p in pads) == ["a0", "a1"]  # g once (to [6, 40]), w's rows (K) once


def test_aligned_and_integer_matmuls_are_left_alone(always):
    for args in ((torch.randn(8, 16), torch.randn(16, 32)), (torch.randint(0, 3, (5, 7)), torch.randint(0, 3, (7, 3)))):
        graph = graph_of(lambda a, b: a @ b, *args)
        assert pad_matmuls(graph) is graph


def test_auto_pads_nothing_on_the_cpu_and_never_pads_nothing():
    graph = graph_of(lambda a, b: a @ b, torch.randn(6, 13), torch.randn(13, 37))
    assert pad_matmuls(graph) is graph  # "auto" times CUDA matmuls only
    with config.override(pad_matmuls="never"):
        assert pad_matmuls(graph) is graph


def test_an_unknown_mode_is_a_clear_error():
    graph = graph_of(lambda a, b: a @ b, torch.randn(6, 13), torch.randn(13, 37))
    with config.override(pad_matmuls="sometimes"), pytest.raises(config.ConfigError, match="pad_matmuls"):
        pad_matmuls(graph)


def test_a_product_read_only_by_kernels_is_not_copied(always):
    graph = pad_matmuls(graph_of(lambda a, b: (a @ b).relu(), torch.randn(8, 16), torch.randn(16, 37)))
    plan = fusion.plan(graph)
    assert "clone" not in ops_of(graph) and len(plan.kernels) == 2  # the pad of b, the relu of the slice


@pytest.mark.gpu
def test_auto_pads_a_vocabulary_projection_on_the_gpu():
    # GPT-2's: [8192, 1024] @ [1024, 50257] in bfloat16 runs on align1 kernels unpadded
    h = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(50257, 1024, device="cuda", dtype=torch.bfloat16)
    fn = lambda h, w: F.linear(h, w).float().logsumexp(-1)  # noqa: E731
    source = minicomp.jit(fn).source(h, w)
    assert "padded" in source
    torch.testing.assert_close(minicomp.jit(fn)(h, w), fn(h, w), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_padding_is_timed_on_real_tensors_inside_a_trace(tmp_path, monkeypatch):
    # AOTAutograd compiles a forward under fake tensors: timed there, an mm runs nothing and the
    # padded form never looked worth it. GPT-2's projection, W transposed: align1 unpadded.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from minicomp.runtime.matmul_timing import padding_pays

    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))  # measured here, not remembered
    plain = (((8192, 1024), (1024, 1)), ((1024, 50257), (1, 1024)))
    padded = (((8192, 1024), (1024, 1)), ((1024, 50264), (1, 1024)))
    with FakeTensorMode():
        assert padding_pays("mm", torch.bfloat16, torch.device("cuda"), plain, padded, [plain[1]])


@pytest.mark.parametrize(
    "head, stride",
    [
        (lambda h, w, b: F.linear(h, w, b), (120, 40, 1)),  # [2, 3, 37] over the [6, 40] product
        (lambda h, w, b: F.linear(h, w, b).transpose(0, 1), (40, 120, 1)),
        (lambda h, w, b: F.linear(h, w, b).flatten(), (1,)),  # no view of the strided slice: copied out
    ],
)
def test_an_inference_output_comes_out_at_the_padded_stride(always, head, stride):
    # through torch.compile a forward no backward follows returns a padded product's slice (and
    # views torch can take of it) uncopied, as Inductor does: the logits of an odd vocabulary
    h, w, b = torch.randn(2, 3, 16), torch.randn(37, 16), torch.randn(37)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(head, backend="minicomp")(h, w, b)
    assert out.stride() == stride
    torch.testing.assert_close(out, head(h, w, b))


@pytest.mark.parametrize(
    "head, stride",
    [
        (lambda h, w, b: F.linear(h, w, b), lambda s: (s * 40, 40, 1)),
        (lambda h, w, b: F.linear(h, w, b).transpose(0, 1), lambda s: (40, s * 40, 1)),
        (lambda h, w, b: F.linear(h, w, b).flatten(), lambda s: (1,)),
    ],
)
def test_a_dynamic_inference_output_comes_out_at_the_padded_stride(always, head, stride):
    # the same at every length of a dynamic graph (Dynamo's second length, then one per length
    # compiled from it): a copy of GPT-2's logits was 0.24 of a 1.4 ms step
    w, b = torch.randn(37, 16), torch.randn(37)
    compiled = torch.compile(head, backend="minicomp")
    torch._dynamo.reset()
    for length in (3, 4, 5, 6):
        h = torch.randn(2, length, 16)
        with torch.no_grad():
            out = compiled(h, w, b)
        assert out.stride() == stride(length)
        torch.testing.assert_close(out, head(h, w, b))


def test_a_training_forward_returns_eagers_layout(always):
    # the logits a training forward returns beside its loss keep eager's strides
    h, w = torch.randn(2, 3, 16), torch.randn(37, 16, requires_grad=True)
    y = torch.randint(0, 37, (6,))

    def f(h, w):
        logits = F.linear(h, w)
        return F.cross_entropy(logits.flatten(0, 1), y), logits

    torch._dynamo.reset()
    loss, logits = torch.compile(f, backend="minicomp")(h, w)
    assert logits.stride() == (111, 37, 1)
    torch.testing.assert_close(logits, F.linear(h, w))


@pytest.mark.parametrize(
    "head",
    [
        lambda y: (y, y.transpose(0, 1), y[..., :5]),  # outputs that view one another
        lambda y: (y[:, 1], y),
        lambda y: (y.flatten(0, 1), y.flatten(0, 1).t()),
    ],
)
def test_inference_outputs_viewing_one_another_keep_eagers_values(always, head):
    # AOTAutograd rebuilds an output that aliases another from it: at the padded strides too
    h, w, b = torch.randn(2, 3, 16), torch.randn(37, 16), torch.randn(37)

    def f(h, w, b):
        return head(F.linear(h, w, b))

    torch._dynamo.reset()
    with torch.no_grad():
        outs = torch.compile(f, backend="minicomp")(h, w, b)
    for mine, eager in zip(outs, f(h, w, b)):
        assert mine.shape == eager.shape
        torch.testing.assert_close(mine, eager)


def test_a_view_torch_cannot_take_of_the_slice_is_still_read_in_kernels(always):
    # the flattened logits are no view of the row-padded slice, but a kernel reads them by index:
    # the slice stays a view of the padded product, not copied out
    h, w = torch.randn(6, 16), torch.randn(37, 16)

    def f(h, w):
        return torch.softmax((h @ w.t()).view(-1), 0)

    source = check(f, h, w)
    assert "aten.clone" not in source and "mm_padded" in source
