"""Issue: see inside. explain, log channels, profiler names, the Dynamo backend, nn.Module."""

import importlib.metadata
import logging
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import workloads as w

import minicomp
import minicomp.dispatch.dynamo
from minicomp import logs


def test_explain_shows_every_stage_and_writes_the_image(tmp_path):
    x, b = torch.randn(4, 16), torch.randn(16)
    report = minicomp.explain(w.gelu_tanh, x, b, image=tmp_path / "gelu.svg")
    text = str(report)
    for title in ["captured ATen graph", "IR", "fusion plan", "generated module", "image"]:
        assert f"==== {title}" in text
    assert "torch.ops.aten.tanh.default" in text  # the FX graph
    assert "= aten.tanh.default(" in text  # the IR
    assert "kernel mc_fused_add_mul_pow_tanh_0" in text  # the plan
    assert "@triton.jit" in text  # the source
    svg = ET.parse(report.image).getroot()
    labels = "".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "mc_fused_add_mul_pow_tanh_0" in labels and "tanh" in labels


def test_source_of_an_expanded_or_overlapping_argument(device):
    """Regression: `fn.source(b.expand(...))` copied the argument into its own strides with
    `copy_`, which refuses a layout whose elements share memory (a raw RuntimeError). The copy
    keeps the strides (the signature compiled is the one called) and the values."""
    b = torch.randn(16, device=device)
    fn = minicomp.jit(lambda y: y * 2)
    for arg in (b.expand(4, 16), b.as_strided((3, 8), (4, 1)), b[1::3]):
        assert f"stride {tuple(arg.stride())}" in fn.source(arg)
        torch.testing.assert_close(fn(arg), arg * 2)


def test_explain_gives_the_reason_a_value_is_not_fused(tmp_path):
    def mlp(x, w1, b):
        return torch.sigmoid(torch.relu(x * 2) @ w1 + b)

    report = str(minicomp.explain(mlp, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)))
    assert "not fused:" in report and "runs as an ATen call" in report


def test_explain_covers_forward_and_backward():
    q, k = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(2))
    report = str(minicomp.explain(w.rope, q, k, torch.randn(4, 8), torch.randn(4, 8)))
    assert "==== fusion plan (forward)" in report and "==== fusion plan (backward)" in report


def test_explain_reports_the_planned_peak_and_what_is_saved():
    # issue #41: an MLP's training step, [64, 32] @ [32, 128] -> GELU -> @ [128, 32] in float32
    def mlp_loss(x, w1, w2):
        return (torch.nn.functional.gelu(x @ w1) @ w2).square().mean()

    args = [torch.randn(64, 32, requires_grad=True), torch.randn(32, 128, requires_grad=True)]
    report = minicomp.explain(mlp_loss, *args, torch.randn(128, 32, requires_grad=True))
    sections = dict(report.sections)
    forward, backward = sections["memory (forward)"], sections["memory (backward)"]
    assert forward.startswith("planned peak: ") and backward.startswith("planned peak: ")
    assert "  mm: 0.031 MiB" in forward  # the [64, 128] float32 product, alive at the peak
    assert "saved for the backward: " in forward and "  mm: float32[64, 128] 0.031 MiB" in forward
    assert "saved activations counted until theirs" in backward


def test_explain_writes_nothing_unless_asked(tmp_path, monkeypatch, capsys):
    """The API and the command line write the picture only when given a path."""
    monkeypatch.chdir(tmp_path)
    report = minicomp.explain(w.bias_relu, torch.randn(4, 16), torch.randn(16))
    assert report.image is None and "==== image" not in str(report)
    from minicomp.__main__ import main

    assert main(["explain", "bias_relu"]) == 0
    assert "==== generated module" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert main(["explain", "bias_relu", "--image", "bias_relu.svg"]) == 0
    assert (tmp_path / "bias_relu.svg").exists()


def test_log_channels_switch_on_and_off(caplog):
    caplog.set_level(logging.INFO, logger="minicomp")
    x = torch.randn(3, 5)
    try:
        logs.set_logs("fusion,recompiles")
        fn = minicomp.jit(lambda x: torch.relu(x) - 1)
        fn(x)
        fn(torch.randn(4, 5))
        channels = {r.name for r in caplog.records}
        assert {"minicomp.fusion", "minicomp.recompiles"} <= channels
        assert "minicomp.graph" not in channels and "minicomp.output_code" not in channels
        assert any("shape torch.Size([3, 5]) -> torch.Size([4, 5])" in r.getMessage() for r in caplog.records)
        caplog.clear()
        logs.set_logs("")
        minicomp.jit(lambda x: torch.relu(x) - 2)(x)
        assert not [r for r in caplog.records if r.levelno < logging.WARNING]
    finally:
        logs.set_logs(os.environ.get("MINICOMP_LOGS", ""))
    with pytest.raises(ValueError, match="unknown MINICOMP_LOGS channel"):
        logs.set_logs("fusoin")


def test_minicomp_logs_environment_variable(tmp_path):
    script = "import torch, minicomp; minicomp.jit(lambda x: x.sin() * 2)(torch.randn(4))"
    env = dict(os.environ, MINICOMP_LOGS="output_code,cache", MINICOMP_CACHE_DIR=str(tmp_path))
    err = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stderr
    assert "[minicomp.output_code]" in err and "@triton.jit" in err and "[minicomp.cache]" in err
    assert "[minicomp.graph]" not in err


def test_profiler_sees_a_range_per_call(device):
    fn = minicomp.jit(w.bias_relu)
    x, b = torch.randn(8, 32, device=device), torch.randn(32, device=device)
    fn(x, b)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        fn(x, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    assert "minicomp: bias_relu" in names
    if device.type == "cuda":  # the kernel itself, under its generated name
        assert any(n.startswith("mc_fused_add_relu_0") for n in names), names


class TwoStage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = torch.nn.functional.gelu(x * self.scale)
        print("graph break here")  # Dynamo splits the graph: two graphs for minicomp
        return torch.relu(y + 1) * 2


def test_dynamo_backend_runs_a_module_with_a_graph_break(device, capsys):
    torch._dynamo.reset()
    model = TwoStage().to(device)
    x = torch.randn(4, 16, device=device)
    before = next(minicomp.dispatch.dynamo._graph_ids)
    compiled = torch.compile(model, backend=minicomp.dispatch.dynamo.backend)
    torch.testing.assert_close(compiled(x), model(x))
    assert next(minicomp.dispatch.dynamo._graph_ids) - before - 1 >= 2  # both graphs went through minicomp
    x.requires_grad_(True)
    compiled(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_dynamo_dynamic_sizes_compile_once_per_size(device, monkeypatch):
    """From a function's second size on, Dynamo hands the backend graphs with symbolic sizes.
    They ran uncompiled (a warning named the cause as a data-dependent shape); now each size
    compiles its own static graph (specialize.py), forward and backward, and a size seen before
    compiles nothing. MINICOMP_FALLBACK=raise (conftest): a fallback would fail the test."""
    from minicomp.dispatch import dynamo

    compiles = []
    real = dynamo.compile_graph
    monkeypatch.setattr(
        dynamo, "compile_graph", lambda gm, name, *a, **k: compiles.append(name) or real(gm, name, *a, **k)
    )
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).to(device)
    fn = torch.compile(model, backend=minicomp.dispatch.dynamo.backend)
    for rows in (3, 5, 7, 5):
        before = len(compiles)
        x = torch.randn(rows, 8, device=device, requires_grad=True)
        out = fn(x)
        torch.testing.assert_close(out, model(x))
        out.square().sum().backward()
        torch.testing.assert_close(x.grad, torch.autograd.grad(model(x).square().sum(), x)[0])
        if rows == 7:
            assert len(compiles) - before == 2  # the forward and the backward of this size
    assert len(compiles) == before  # 5 again: nothing compiled


def test_dynamo_backend_is_registered_by_name():
    try:
        points = importlib.metadata.entry_points(group="torch_dynamo_backends")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        points = []
    if not any(p.name == "minicomp" for p in points):
        pytest.skip("minicomp is not installed (running from a source tree)")
    torch._dynamo.reset()
    assert "minicomp" in torch._dynamo.list_backends()
    fn = torch.compile(w.swiglu, backend="minicomp")
    g, u = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(fn(g, u), w.swiglu(g, u))


def test_jit_accepts_a_module_and_trains_it(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    reference.load_state_dict(model.state_dict())
    jitted = minicomp.jit(model)
    x = torch.randn(5, 8, device=device)
    torch.testing.assert_close(jitted(x), reference(x))
    for net in (jitted, reference):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net(x).square().sum().backward()
        opt.step()
    torch.testing.assert_close(model[0].weight, reference[0].weight)  # gradients reached the parameters
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), reference(x))  # and the update is seen


def test_explain_names_the_attention_scores_the_backward_recomputes():
    """issue #41: written-out attention's scores and softmax are recomputed, not saved
    (dispatch/expanding_products.py), and the backward's memory section says so."""
    import math

    def attention(q, k, v):
        return (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v).sum()

    q, k, v = (torch.randn(4, 32, 8, requires_grad=True) for _ in range(3))
    backward = dict(minicomp.explain(attention, q, k, v).sections)["memory (backward)"]
    assert "recomputed here, not saved (checkpoint policy: expanding products): bmm" in backward
    forward = dict(minicomp.explain(attention, q, k, v).sections)["memory (forward)"]
    assert "float32[4, 32, 32]" not in forward  # no [B, S, S] value saved
