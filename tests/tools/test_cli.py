"""The `minicomp` command: every `--help` prints help and runs nothing; the demo prints what the
README says (a line per seed workload, then one generated module); nothing is written unasked."""

import os
import subprocess
import sys

import pytest
import torch

from minicomp.__main__ import COMMANDS, main

HELP = [[], *([c] for c in COMMANDS)]


@pytest.mark.parametrize("command", HELP, ids=["minicomp", *COMMANDS])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_help_and_runs_nothing(command, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([*command, flag])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: minicomp {command[0] if command else ''}".rstrip())
    assert "minicomp demo on" not in out and "====" not in out  # nothing compiled, nothing explained
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_help_through_python_dash_m(tmp_path):
    """`python -m minicomp demo --help` from outside the checkout: help, exit 0, no demo."""
    for args in (["--help"], ["demo", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "minicomp", *args],
            cwd=tmp_path,
            env=dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path / "cache")),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("usage: minicomp") and "minicomp demo on" not in out.stdout
    assert [p.name for p in tmp_path.iterdir()] == []


def test_unknown_command_or_workload_is_a_usage_error(capsys):
    for argv in (["demos"], ["demo", "gelu"], ["demo", "bias_relu", "--code", "swiglu"], ["explain", "nope"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
    assert "usage:" in capsys.readouterr().err


def test_demo_prints_a_line_per_workload_then_one_module(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "bias_relu", "swiglu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.startswith("ok  bias_relu ") and "1 kernel(s)" in line for line in lines)
    assert any(line.startswith("ok  swiglu ") for line in lines)
    assert out.count("==== generated module: ") == 1 and "==== generated module: swiglu" in out
    assert "@triton.jit" in out and "def call" in out
    assert "minicomp demo --code bias_relu" in out  # how to see the rest
    assert list(tmp_path.iterdir()) == []


def test_demo_code_all_prints_every_module(capsys):
    assert main(["demo", "bias_relu", "gelu_erf", "--code", "all"]) == 0
    out = capsys.readouterr().out
    assert "==== generated module: bias_relu" in out and "==== generated module: gelu_erf" in out


def test_explain_writes_an_image_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "bias_relu"]) == 0
    assert "==== generated module" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert main(["explain", "bias_relu", "--image", "graph.svg"]) == 0
    assert "written to graph.svg" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["graph.svg"]


def test_bench_models_is_the_model_suite(tmp_path, capsys):
    """`minicomp bench models`: its options; without a GPU and without --tiny, a usage error, not a
    traceback; its plot of minicomp / Inductor per row (issue #38)."""
    with pytest.raises(SystemExit) as done:
        main(["bench", "models", "--help"])
    assert done.value.code == 0 and "--models" in capsys.readouterr().out
    if not __import__("torch").cuda.is_available():
        with pytest.raises(SystemExit) as done:
            main(["bench", "models", str(tmp_path / "out.json")])
        assert done.value.code == 2 and "--tiny" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    from minicomp.bench.models import add_ratios, plot

    rows = [
        dict(model="bert", step="train", variant="inductor", ms=4.2, peak_mib=774.0),
        dict(model="bert", step="train", variant="minicomp", ms=4.2, peak_mib=921.0),
        dict(model="gpt2", step="decode", variant="inductor-ro", ms=0.37),
        dict(model="gpt2", step="decode", variant="minicomp-graphs", ms=0.26),
    ]
    add_ratios(rows)
    assert rows[1]["x_inductor"] == {"ms": 1.0, "peak_mib": 921.0 / 774.0}
    assert rows[3]["x_inductor_ro"] == {"ms": 0.26 / 0.37}
    assert plot(rows, tmp_path / "models.png").stat().st_size > 0
    assert plot(rows[:1], tmp_path / "none.png") is None  # no minicomp row: no plot


def test_gpu_busy_time_is_the_union_of_activity_ranges():
    # overlapping and nested activities count once; a gap between them is the host's
    from minicomp.bench.model_row import busy_ms

    assert busy_ms([(0, 1000), (500, 1500), (600, 700), (3000, 3500)]) == 2.0
    assert busy_ms([]) == 0.0


def test_gradient_error_is_relative_per_parameter_then_the_median():
    # each parameter's error counts alike whatever its gradient's scale; a gradient that is zero
    # but for rounding does not decide the number; no gradient: left out
    from minicomp.bench.model_row import relative_error

    reference = [torch.tensor([1.0, -1.0]), torch.tensor([1000.0, 1000.0]), torch.tensor([1e-9, 0.0]), None]
    grads = [torch.tensor([1.5, -1.5]), torch.tensor([1100.0, 1000.0]), torch.tensor([1e-3, 0.0]), torch.ones(1)]
    assert relative_error(grads, reference) == pytest.approx(0.5)
    assert relative_error(reference, reference) == 0.0


def test_aot_eager_rows_only_on_request():
    """The suite's `aot_eager` variant (a first call's floor through torch.compile) runs when named,
    after the default variants, and not by default."""
    from minicomp.bench.models import VARIANTS, jobs

    assert "aot_eager" not in VARIANTS
    named = jobs([("bert", "train")], ["minicomp", "aot_eager"])
    assert [j["variant"] for j in named] == ["minicomp", "aot_eager"]
    assert all(j["variant"] != "aot_eager" for j in jobs([("bert", "train")], VARIANTS))


def test_variants_with_torch_compile_options():
    """`minicomp:NAME=VALUE,...` is a row of its own, compiled with those options (config's tunables);
    an unknown tunable is an error at the first call, as torch.compile's options are."""
    from minicomp import config
    from minicomp.bench.model_row import _pairs, _value, compiled, make_step
    from minicomp.bench.model_specs import Task
    from minicomp.bench.models import jobs

    rows = jobs([("bert", "train"), ("gpt2", "decode")], ["minicomp:chunk_budget_bytes=4096", "minicomp", "eager"])
    assert [(j["model"], j["variant"]) for j in rows] == [
        ("bert", "eager"),
        ("bert", "minicomp:chunk_budget_bytes=4096"),
        ("bert", "minicomp"),
        ("gpt2", "eager"),
        ("gpt2", "minicomp:chunk_budget_bytes=4096"),
        ("gpt2", "minicomp"),
    ]  # fmt: skip (eager first, then each kind in the order asked)
    assert [
        j["variant"] for j in jobs([("bert", "train")], ["minicomp-graphs:cuda_graph_limit=2+cuda_graphs=true"])
    ] == []
    assert _pairs("a=1+b=x") == [("a", "1"), ("b", "x")]
    assert [_value(v) for v in ("12", "-3", "2.5", "true", "False", "auto")] == [12, -3, 2.5, True, False, "auto"]
    torch._dynamo.reset()
    task = Task(torch.nn.Linear(4, 3), "ce")
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        original = config.override
        patch.setattr(config, "override", lambda **kw: (seen.append(kw.get("chunk_budget_bytes")), original(**kw))[1])
        loss = make_step(task, compiled(task, "minicomp:chunk_budget_bytes=4096"), "train", (x,), {}, y)()
    torch.testing.assert_close(loss, task(x, target=y))
    assert 4096 in seen
    torch._dynamo.reset()
    with pytest.raises(Exception, match="no_such_tunable"):
        compiled(task, "minicomp:no_such_tunable=1")(x)


def test_suite_command_line_takes_option_variants(monkeypatch, tmp_path):
    """`--variants minicomp:NAME=VALUE+NAME=VALUE` is a known variant (only the unknown model is named)."""
    from minicomp.bench import models

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    argv = [
        str(tmp_path / "out.json"),
        "--tiny",
        "--models",
        "nosuch",
        "--variants",
        "minicomp:chunk_budget_bytes=4096+cuda_graphs=false",
    ]
    with pytest.raises(SystemExit, match=r"unknown models, steps or variants: \['nosuch'\]"):
        models.main(argv)


def test_a_decode_static_step_repeats_past_the_caches_end():
    """transformers' StaticCache advances its own length at each call; a decode-static step of the
    suite (side_by_side.py runs 2,130 of them) must not run off the cache's end (it did after S/2
    calls: an index error in index_copy_): its lengths stay between S/2 and S."""
    transformers = pytest.importorskip("transformers")
    from minicomp.bench.model_row import make_step
    from minicomp.bench.model_specs import MODELS, build_task, step_inputs

    spec = MODELS["gpt2"]
    s = spec.sizes(True)
    task = build_task(spec, transformers, s, "decode-static", "cpu", torch.float32)
    args, kwargs, _ = step_inputs(spec, s, "decode-static", task, s.length, "cpu", torch.float32, torch.float32)
    lengths = [getattr(layer, "cumulative_length", None) for layer in getattr(kwargs["past_key_values"], "layers", ())]
    if not lengths or not all(isinstance(length, torch.Tensor) for length in lengths):
        pytest.skip("this transformers' StaticCache writes at cache_position: nothing advances")
    run = make_step(task, task, "decode-static", args, kwargs, None)
    first = run()
    for _ in range(3 * s.length):
        out = run()
        assert all(s.length // 2 <= int(length) <= s.length for length in lengths)
    assert out.shape == first.shape
