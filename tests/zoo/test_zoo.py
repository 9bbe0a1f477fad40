"""The model zoo (issue #43): real architectures, tiny random configs, through minicomp against
eager (minicomp/tools/zoo.py), each model in its own process with a time limit.

- The fast subset (an encoder, a decoder, a CNN with batch norm, a state-space model), in
  `make test` and CI (marked `slow`: a subprocess each, 10-45 s on 2 cores, about 90 s in all).
- The full zoo: `python -m pytest -m zoo tests/zoo` (a test per model; skipped unless `-m`
  names `zoo`, so a plain `pytest` leaves it out), or `python -m minicomp zoo` for the table.
- The harness itself (judging, the summary, timeouts, the command line): no transformers needed.

Models need their source (transformers: `pip install .[zoo]`; timm, torchvision): without it
they skip.
"""

import pytest
import torch

from minicomp.tools import zoo, zoo_run
from minicomp.tools.zoo_models import FAST, MODELS


def _passes(name: str, modes=zoo_run.MODES) -> None:
    pytest.importorskip(MODELS[name].source)
    results = zoo.run_model(name, modes, timeout=300)
    failed = [r for r in results if r["verdict"] not in zoo.PASSING]
    assert not failed, zoo.summary(results) + "\n" + zoo.markdown(failed)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST)
def test_fast_subset_matches_eager(name):
    """All modes but `jit-train` (Mamba's takes 80 s in the interpreter; the full zoo runs it)."""
    _passes(name, [m for m in zoo_run.MODES if m != "jit-train"])


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.parametrize("name", [n for n in MODELS if n not in FAST])
def test_zoo_matches_eager(name, request):
    if "zoo" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full zoo runs with `python -m pytest -m zoo tests/zoo` (or `python -m minicomp zoo`)")
    _passes(name)


# -- the harness -----------------------------------------------------------------------------


def test_judge_allows_eagers_own_error_and_names_the_worst_tensor():
    ref = {"output0": torch.linspace(-1, 1, 50, dtype=torch.float64), "grad w": torch.ones(4, dtype=torch.float64)}
    want = {k: v.float() for k, v in ref.items()}
    worst, cond = zoo_run._judge(want, want, ref)
    assert worst["ratio"] <= 1 and cond < 1e-6
    off = dict(want, **{"grad w": want["grad w"] + 1e-3})
    worst, _ = zoo_run._judge(off, want, ref)
    assert worst["tensor"] == "grad w" and worst["ratio"] > 1
    shaped = dict(want, **{"grad w": torch.ones(5)})
    assert zoo_run._judge(shaped, want, ref)[0]["ratio"] == float("inf")


def test_judge_allows_noise_where_the_exact_value_is_zero():
    """A key bias's gradient is 0 in exact arithmetic: float32 gives rounding noise, in eager
    and compiled alike; noise of a few times eager's passes, a real value does not."""
    ref = {"grad big": torch.ones(3, dtype=torch.float64), "grad key.bias": torch.zeros(8, dtype=torch.float64)}
    want = {"grad big": torch.ones(3), "grad key.bias": torch.full((8,), 1e-13)}
    noise = dict(want, **{"grad key.bias": torch.full((8,), -3e-13)})
    worst, cond = zoo_run._judge(noise, want, ref)
    assert worst["ratio"] <= 1 and cond < 1e-6, worst
    real = dict(want, **{"grad key.bias": torch.full((8,), 1e-3)})
    assert zoo_run._judge(real, want, ref)[0]["tensor"] == "grad key.bias"


def test_summary_counts_each_verdict():
    results = [
        dict(model="a", group="g", mode="forward", verdict="right", compile_s=1.0),
        dict(model="a", group="g", mode="train", verdict="crash", detail="backward: InterpreterError: x", graph="g1"),
        dict(model="b", group="g", mode="forward", verdict="fallback", detail="dynamo_graph0_backward: why"),
        dict(model="b", group="g", mode="train", verdict="wrong", detail="grad w: 3x the tolerance"),
        dict(model="c", group="g", mode="forward", verdict="unsupported", detail="documented"),
        dict(model="d", group="g", mode="forward", verdict="skipped", detail="timm: not installed"),
    ]
    line = zoo.summary(results)
    assert line.startswith("1/5 right, 1 crashes, 1 wrong, 1 whole-graph fallbacks"), line
    assert "1 documented unsupported" in line and "1 skipped" in line
    table = zoo.markdown(results)
    assert "| a | g | train | crash |  |  | backward: InterpreterError: x (in g1) |" in table


def test_a_mode_past_its_time_limit_is_a_timeout():
    """The child is killed; every mode still to run gets its own process (and here its own timeout)."""
    results = zoo.run_model("bert", ["forward", "train"], timeout=0.5)
    assert [(r["mode"], r["verdict"]) for r in results] == [("forward", "timeout"), ("train", "timeout")]


def test_command_line(capsys):
    from minicomp.__main__ import main

    assert main(["zoo", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in MODELS) and "(fast)" in out
    for argv in (["zoo", "--models", "nope"], ["zoo", "--modes", "backward"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
