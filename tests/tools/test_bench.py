"""The benchmark harness logic (CPU): the correctness gate, the floor arithmetic, the outputs."""

import json

import pytest
import torch

from minicomp.bench import measure, report, run


def test_floor_counts_each_input_and_output_once():
    x, b = torch.zeros(4, 8), torch.zeros(8)
    out = torch.zeros(4, 8)
    assert measure.floor_bytes([x, b], [out], backward=False) == (32 + 8 + 32) * 4
    q = torch.zeros(2, 3, requires_grad=True)
    # backward also reads the output's gradient and writes q's
    assert measure.floor_bytes([q], [torch.zeros(2, 3)], backward=True) == 4 * 6 * 4


def test_gate_reports_a_wrong_implementation_instead_of_timing_it():
    fn = lambda x: x * 2  # noqa: E731
    impls = {"eager": fn, "good": lambda x: x + x, "bad": lambda x: x * 3}
    verdict = run.check(impls, [torch.randn(5)], backward=False, dtype=torch.float32)
    assert verdict["good"] == "ok" and verdict["bad"].startswith("WRONG")


def test_low_precision_gate_uses_a_float32_reference():
    """Eager (rounding every op to bf16) and fused code (rounding once) both pass
    against the float32 reference; a 5% wrong answer fails."""
    fn = lambda x, y: x * 3.3 - y * 2.9  # noqa: E731
    fused = lambda x, y: (x.float() * 3.3 - y.float() * 2.9).to(x.dtype)  # noqa: E731
    impls = {"eager": fn, "fused": fused, "bad": lambda x, y: fn(x, y) * 1.05}
    x = torch.randn(4096).bfloat16()
    verdict = run.check(impls, [x, torch.randn(4096).bfloat16()], backward=False, dtype=torch.bfloat16)
    assert verdict["eager"] == "ok" and verdict["fused"] == "ok" and verdict["bad"].startswith("WRONG")


def test_ratios_geomean_and_outputs(tmp_path):
    common = dict(workload="w", dtype="float32", size=1, check="ok", floor_ms=1.0, bytes=8)
    rows = [
        dict(common, impl="inductor", ms=2.0, gbps=1.0, x_floor=2.0),
        dict(common, impl="minicomp", ms=1.0, gbps=2.0, x_floor=1.0),
    ]
    report.add_ratios(rows)
    assert rows[1]["x_inductor"] == 0.5
    assert abs(report.geomean([0.5, 2.0]) - 1.0) < 1e-12
    extra = {"device": "test", "torch": torch.__version__, "command": "minicomp bench"}
    report.write(tmp_path, rows, extra)
    assert json.loads((tmp_path / "results.json").read_text())["rows"][1]["x_inductor"] == 0.5
    assert "| w | float32 | 1 | minicomp | ok |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "results.csv").exists() and (tmp_path / "w_float32.png").exists()


def test_a_missed_target_names_what_a_copy_of_the_same_bytes_takes():
    """A row over the floor target is reported with the copy of as many bytes at its size: whether a
    kernel could reach the target at all there."""
    common = dict(workload="w", dtype="bfloat16", size=8192, check="ok", floor_ms=1.0, bytes=8, copy_ms=1.09)
    rows = [
        dict(common, impl="inductor", ms=1.2, gbps=1.0, x_floor=1.2, x_copy=1.2 / 1.09),
        dict(common, impl="minicomp", ms=1.1, gbps=1.0, x_floor=1.1, x_copy=1.1 / 1.09),
    ]
    report.add_ratios(rows)
    table = report.markdown(rows, {"device": "test", "torch": torch.__version__, "command": "minicomp bench"})
    assert "| x floor | x copy | x Inductor |" in table
    assert "| 1.100 | 1.009 | 0.917 |" in table
    assert "missed by w/bfloat16 (1.100; a copy of as many bytes: 1.090)" in table


@pytest.mark.slow  # compiles with Inductor and minicomp
def test_cpu_run_checks_and_skips_timings(tmp_path, capsys):
    if torch.cuda.is_available():
        return  # on a GPU this would be a full benchmark run
    assert (
        run.main(["--workloads", "bias_relu", "--dtypes", "float32", "--out", str(tmp_path), "--skip-compile-time"])
        == 0
    )
    assert "No CUDA GPU" in capsys.readouterr().out
    table = (tmp_path / "cpu" / "table.md").read_text()
    assert "| bias_relu | float32 | 4 | minicomp | ok | - |" in table
