"""Compiled functions train: gradients match eager, and the backward is fused too."""

import pytest
import torch
import workloads as w
from conftest import grads_match, kernel_count

import minicomp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_seed_workload_gradients(device, dtype):
    x, y, g = (torch.randn(7, 33, device=device, dtype=dtype) for _ in range(3))
    b = torch.randn(33, device=device, dtype=dtype)
    grads_match(w.gelu_tanh, x, b)
    grads_match(w.gelu_erf, x)
    grads_match(w.bias_relu, x, b)
    grads_match(w.lora_epilogue, x, y, b)
    grads_match(w.swiglu, g, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_backward_is_one_kernel_and_saves_only_cos_sin(device, dtype):
    q, k = (torch.randn(2, 3, 5, 8, device=device, dtype=dtype) for _ in range(2))
    cos, sin = (torch.randn(5, 8, device=device, dtype=dtype) for _ in range(2))
    entry = grads_match(w.rope, q, k, cos, sin, grad_of=[0, 1])
    assert kernel_count(entry.forward.source) == 1
    assert kernel_count(entry.backward.source) == 1
    saved = entry.forward.graph.outputs[2:]
    assert set(saved) <= {"cos", "sin"}, saved


def test_interleaved_and_transposed_rope_gradients(device):
    def rope_interleaved(x, cos, sin):
        x1, x2 = x[..., ::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return x * cos.repeat_interleave(2, -1) + rotated * sin.repeat_interleave(2, -1)

    x = torch.randn(2, 3, 5, 12, device=device)
    cos, sin = torch.randn(5, 6, device=device), torch.randn(5, 6, device=device)
    grads_match(rope_interleaved, x, cos, sin, grad_of=[0])
    q = torch.randn(2, 5, 3, 8, device=device).transpose(1, 2)
    c, s = torch.randn(5, 8, device=device), torch.randn(5, 8, device=device)
    entry = grads_match(w.rope, q, q * 2, c, s, grad_of=[0, 1, 2, 3])
    assert kernel_count(entry.backward.source) >= 1


def test_no_grad_and_inference_mode_skip_autograd(device):
    x = torch.randn(4, 4, device=device, requires_grad=True)
    compiled = minicomp.jit(w.bias_relu)
    b = torch.randn(4, device=device)
    with torch.no_grad():
        out = compiled(x, b)
    assert not out.requires_grad
    with torch.inference_mode():
        compiled(x, b)
    assert all(not hasattr(e, "forward") for e in compiled.cache.values())


def test_retain_graph_double_calls_and_partial_grads(device):
    compiled = minicomp.jit(lambda x, y: (x * y).sin())
    x = torch.randn(5, device=device, requires_grad=True)
    y = torch.randn(5, device=device)  # no grad for y
    a, b = compiled(x, y), compiled(x, y * 2)  # two calls before one backward
    (a.sum() + b.sum()).backward(retain_graph=True)
    first = x.grad.clone()
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(x.grad, 2 * first)
    expected = (y * torch.cos(x * y) + 2 * y * torch.cos(x * 2 * y)).detach()
    torch.testing.assert_close(first, expected)
    assert y.grad is None


def test_view_inputs_and_outputs_without_grad(device):
    base = torch.randn(6, 8, device=device, requires_grad=True)
    compiled = minicomp.jit(lambda x: (x.exp(), (x > 0)))
    out, mask = compiled(base[:, ::2])
    assert not mask.requires_grad
    out.sum().backward()
    expected = torch.zeros(6, 8, device=device)
    expected[:, ::2] = base.detach()[:, ::2].exp()
    torch.testing.assert_close(base.grad, expected)


@pytest.mark.parametrize("path", ["jit", "backend"])
def test_an_expanded_output_takes_any_incoming_gradient(device, path):
    """Fuzz case 543 (torch 2.11): an output that is an expand of a computed value (stride 0) got a
    tangent laid out with its strides, and AOTAutograd's backward copied the incoming gradient into
    an `empty_strided` with stride 0, which raised. Its tangent now takes the output's memory format."""

    def fn(x, s):
        return s.flip(0).expand(2), (x * 2)[:, None].expand(3, 4, 5)

    x = torch.randn(3, 5, device=device, requires_grad=True)
    s = torch.tensor(0.5, device=device, requires_grad=True)
    run = minicomp.jit(fn) if path == "jit" else torch.compile(fn, backend="minicomp", fullgraph=True)
    for step in range(3):  # the first call (traced), the next (compiled backward), a plain one
        grads = []
        for f in (fn, run):
            a, b = f(x, s)
            torch.manual_seed(step)
            seeds = torch.randn(2, device=device), torch.randn(3, 4, 5, device=device)
            grads.append(torch.autograd.grad((a * seeds[0]).sum() + (b * seeds[1]).sum(), (x, s)))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want)


def _swiglu_mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down


@pytest.mark.parametrize("recompute", [True, False])
def test_a_value_a_backward_matmul_reads_is_recomputed_not_saved(device, recompute):
    """SwiGLU's `silu(x @ gate) * (x @ up)`, which the down projection's weight gradient reads
    whole, is recomputed in the backward from the two products saved anyway (config
    "recompute_for_memory"): the forward saves the products and not it; off, it is saved."""
    x = torch.randn(12, 16, device=device)
    gate, up, down = (
        torch.randn(16, 24, device=device) / 4,
        torch.randn(16, 24, device=device) / 4,
        torch.randn(24, 16, device=device) / 4,
    )
    with minicomp.config.override(recompute_for_memory=recompute):
        entry = grads_match(_swiglu_mlp, x, gate, up, down)
    saved = entry.forward.graph.outputs[1:]
    shapes = [tuple(entry.forward.graph[s].meta.shape) for s in saved if isinstance(s, str)]
    products = shapes.count((12, 24))
    assert products == (2 if recompute else 3), (saved, shapes)
