"""Batch norm as reductions + pointwise (issue #38), against eager.

Every form batch norm takes in a trace (native_batch_norm, `_native_batch_norm_legit` and its
functional and no-training forms, `_batch_norm_with_update` and its functional form,
`_batch_norm_no_update`, cudnn_batch_norm's decomposition to them, and their backwards) decomposes
(capture/tracing.py `FUSED_FROM_PARTS`): the statistics are a reduction over N and the spatial dims
(an outer reduction in channels_last), the normalization, affine, ReLU and residual add its
pointwise consumers, so a training forward is one kernel and its backward one more. The running
statistics' new values are stored by that kernel into the buffers themselves (codegen/reuse.py
`written_in_place`), not into new tensors copied back; `num_batches_tracked + 1` too. Through
`minicomp.jit(module)` and `torch.compile(module, backend="minicomp")`, two training steps: outputs,
input and parameter gradients and every buffer as eager's.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from conftest import aten_call, check, grads_match, kernel_count

import minicomp
import minicomp.dispatch.dynamo
import minicomp.pipeline

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture
def graphs(monkeypatch, tmp_path):
    """The graphs compiled meanwhile (both paths), from a cache of their own (nothing served from disk)."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    compiled, real = [], minicomp.pipeline.compile_graph

    def spy(gm, *args, **kwargs):
        compiled.append(real(gm, *args, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(minicomp.pipeline, "compile_graph", spy)
    monkeypatch.setattr(minicomp.dispatch.dynamo, "compile_graph", spy)
    torch._dynamo.reset()
    return compiled


class Block(torch.nn.Module):
    """conv -> bn (-> + residual) -> relu, ResNet's."""

    def __init__(self, c: int, residual: bool, **bn):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c, **bn)
        self.residual = residual

    def forward(self, x):
        y = self.bn(self.conv(x))
        return F.relu(y + x if self.residual else y)


def _input(shape, channels_last=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


CASES = {  # name -> (module, input shape, channels_last)
    "1d": (lambda: torch.nn.BatchNorm1d(6), (8, 6), False),
    "1d-length": (lambda: torch.nn.BatchNorm1d(6), (4, 6, 5), False),
    "2d": (lambda: torch.nn.BatchNorm2d(6), (4, 6, 3, 5), False),
    "2d-channels-last": (lambda: torch.nn.BatchNorm2d(6), (4, 6, 3, 5), True),
    "3d": (lambda: torch.nn.BatchNorm3d(4), (2, 4, 3, 2, 3), False),
    "no-affine": (lambda: torch.nn.BatchNorm2d(6, affine=False), (4, 6, 3, 3), True),
    "no-running-stats": (lambda: torch.nn.BatchNorm2d(6, track_running_stats=False), (4, 6, 3, 3), True),
    "cumulative-average": (lambda: torch.nn.BatchNorm2d(6, momentum=None), (4, 6, 3, 3), True),
}
COMPILE_CASES = ["1d", "2d-channels-last", "no-running-stats", "cumulative-average"]
# momentum=None: nn.BatchNorm reads `float(num_batches_tracked)` into Python for its factor, which
# minicomp.jit refuses (a trace has no values: it runs eagerly, with the reason) and where Dynamo
# breaks the graph, leaving that frame to eager; the eval forward compiles
READS_VALUES = {"cumulative-average"}


def _steps(model, run, shape, channels_last, steps=2):
    """Two training steps then an eval forward: [(output, input grad), ...], the eval output."""
    model.train()
    results = []
    for step in range(steps):
        x = _input(shape, channels_last, seed=step).requires_grad_()
        out = run(x)
        seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step))
        (out * seed).sum().backward()
        results.append((out.detach(), x.grad))
    model.eval()
    with torch.no_grad():
        evaluated = run(_input(shape, channels_last, seed=7))
    return results, evaluated


def _same_as_eager(make, shape, channels_last, wrap):
    torch.manual_seed(0)
    eager = make()
    with torch.no_grad():  # not the defaults: an affine transform and statistics to update
        for p in eager.parameters():
            p.uniform_(0.5, 1.5)
    mine = copy.deepcopy(eager)
    want, want_eval = _steps(eager, eager, shape, channels_last)
    got, got_eval = _steps(mine, wrap(mine), shape, channels_last)
    for (out, grad), (out_e, grad_e) in zip(got, want):
        torch.testing.assert_close(out, out_e, **TOL)
        torch.testing.assert_close(grad, grad_e, **TOL)
    torch.testing.assert_close(got_eval, want_eval, **TOL)
    for (name, p), p_e in zip(mine.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_e.grad, **TOL, msg=name)
    for (name, b), b_e in zip(mine.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, b_e, **TOL, msg=name)  # num_batches_tracked exactly


@pytest.mark.parametrize("case", list(CASES))
def test_module_through_jit(case, graphs):
    make, shape, channels_last = CASES[case]
    if case in READS_VALUES:
        with pytest.warns(UserWarning, match="reads tensor values"):
            _same_as_eager(make, shape, channels_last, lambda m: minicomp.jit(m, fallback="warn"))
    else:
        _same_as_eager(make, shape, channels_last, minicomp.jit)
    for compiled in graphs:
        assert "batch_norm" not in str(compiled.plan), compiled.plan  # no ATen batch norm left


@pytest.mark.parametrize("case", COMPILE_CASES)
def test_module_through_torch_compile(case, graphs):
    make, shape, channels_last = CASES[case]
    _same_as_eager(make, shape, channels_last, lambda m: torch.compile(m, backend="minicomp"))
    assert graphs
    for compiled in graphs:
        assert "batch_norm" not in str(compiled.plan), compiled.plan


def _sources(graphs) -> list[str]:
    return [c.source for c in graphs]


@pytest.mark.parametrize("residual", [False, True], ids=["conv-bn-relu", "bn-add-relu"])
@pytest.mark.parametrize("path", ["jit", "torch.compile"])
def test_training_step_kernels_and_statistics_in_place(device, residual, path, graphs):
    """The forward: the statistics, normalization, (residual add,) ReLU and the running statistics'
    update in one kernel, `num_batches_tracked + 1` in another, no copy back; the backward: dx,
    dgamma and dbeta in one kernel (an outer reduction of channels_last rows)."""
    torch.manual_seed(0)
    model = Block(8, residual).to(device)
    eager = copy.deepcopy(model)
    run = minicomp.jit(model) if path == "jit" else torch.compile(model, backend="minicomp")
    x = _input((4, 8, 5, 5), channels_last=True).to(device)
    versions = [b._version for b in model.buffers()]
    for _ in range(2):
        run(x).square().sum().backward()
        eager(x).square().sum().backward()
    assert all(b._version > v for b, v in zip(model.buffers(), versions))  # autograd sees them written
    for b, b_e in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(b, b_e, **TOL)
    for p, p_e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_e.grad, atol=1e-3, rtol=1e-4)
    forward, backward = graphs[-2:]
    assert kernel_count(forward.source) == 2, forward.source  # (+ conv, an ATen call)
    assert forward.source.count("the input's new value, written in place") == 3
    assert ".copy_(" not in forward.source
    assert kernel_count(backward.source) == 1, backward.source  # (+ conv's backward)
    assert "rows contiguous" in str(backward.plan)  # channels_last: the outer reduction


def test_eval_is_one_pointwise_kernel(device, graphs):
    torch.manual_seed(0)
    model = Block(8, residual=True).eval().to(device)
    x = _input((2, 8, 4, 4), channels_last=True).to(device)
    with torch.no_grad():
        torch.testing.assert_close(minicomp.jit(model)(x), model(x), **TOL)
    [compiled] = graphs
    assert kernel_count(compiled.source) == 1 and "batch_norm" not in compiled.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_functional_form_updates_the_statistics_in_place(device, channels_last, dtype):
    """F.batch_norm with running statistics, no grad: `check` compares the arguments afterwards
    (float32 statistics of a bfloat16 input, as under autocast)."""
    x = _input((4, 6, 3, 3), channels_last, dtype).to(device)
    rm, rv = torch.randn(6, device=device), torch.rand(6, device=device) + 0.5
    w, b = torch.randn(6, device=device), torch.randn(6, device=device)
    fn = lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3).relu()  # noqa: E731
    source = check(fn, x, rm, rv, w, b, kernels=1)
    assert source.count("the input's new value, written in place") == 2 and ".copy_(" not in source
    assert not aten_call(source)  # no ATen call: not even the unused reserve buffer's `empty`
    check(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False, eps=1e-3) * 2, x, rm, rv, kernels=1)


def test_statistics_read_before_and_after_the_update():
    """The running mean read before the update (by a kernel after a matmul: the old value) and after
    it (the new one, which the trace reads from the decomposition's `copy_`: ir.from_fx maps it to
    the value written), as eager's program order says."""

    def before(x, rm, rv, w):
        s = x.mean(-1) @ w + rm
        return F.batch_norm(x, rm, rv, training=True), s

    def after(x, rm, rv, w):
        y = F.batch_norm(x, rm, rv, training=True)
        return y, ((rm * 2) @ w).relu() + rm

    x, rm, rv, w = _input((4, 6, 3)), torch.randn(6), torch.rand(6) + 0.5, torch.randn(6, 6)
    check(before, x, rm, rv, w)
    check(after, x, rm, rv, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_gradients_of_input_weight_bias(dtype, channels_last):
    """Statistics accumulated in float32 for bfloat16 inputs (judged against float32 eager)."""
    x = _input((4, 6, 3, 3), channels_last, dtype)
    w, b = torch.rand(6, dtype=dtype) + 0.5, torch.randn(6, dtype=dtype)
    entry = grads_match(lambda x, w, b: (F.batch_norm(x, None, None, w, b, training=True) + x).relu(), x, w, b)
    assert kernel_count(entry.forward.source) == 1
    assert kernel_count(entry.backward.source) == 1


class Tracker(torch.nn.Module):
    """Buffers a module updates itself (an exponential average of the input's mean, a step count)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.register_buffer("ema", torch.zeros(6))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
            self.steps += 1
        return y.relu() * self.ema


@pytest.mark.parametrize("path", ["jit", "torch.compile"])
def test_buffers_a_module_updates_in_training(path, graphs):
    """AOTAutograd keeps the buffers' writes in the forward graph (`keep_inference_input_mutations`),
    where the kernels store them. Two steps: outputs, gradients, buffers as eager's."""
    torch.manual_seed(0)
    model = Tracker()
    eager = copy.deepcopy(model)
    run = minicomp.jit(model) if path == "jit" else torch.compile(model, backend="minicomp")
    for step in range(2):
        x = _input((4, 6), seed=step)
        got, want = run(x), eager(x)
        torch.testing.assert_close(got, want, **TOL)
        got.square().sum().backward()
        want.square().sum().backward()
    for b, b_e in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(b, b_e, **TOL)
    for p, p_e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_e.grad, **TOL)
    # the step count in place; the new average is also saved for the backward (the product's
    # gradient reads it), which must not see the next step's write: new memory, copied back
    forward = graphs[0]
    assert forward.source.count(".copy_(") == 1 and forward.source.count("written in place") == 1, forward.source
