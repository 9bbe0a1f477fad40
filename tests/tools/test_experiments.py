"""Every experiment under benchmarks/experiments/ still runs: each on tiny CPU tensors (`--tiny`).

The numbers of a tiny run mean nothing; what is checked is that the script
runs end to end against today's compiler (its imports, the public accessors
it uses, its kernel variants) and writes its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(
    p.stem for p in (ROOT / "benchmarks" / "experiments").glob("*.py") if p.stem not in ("__init__", "harness")
)


def test_the_experiments_are_found():
    assert "launch_config" in EXPERIMENTS and len(EXPERIMENTS) >= 5


@pytest.mark.slow  # a subprocess each, 5-40 s on a 2-core machine
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_tiny(name, tmp_path):
    out = tmp_path / "out.json"
    env = dict(os.environ, TRITON_INTERPRET="1", MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run(
        [sys.executable, "-m", f"benchmarks.experiments.{name}", str(out), "--tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rows"] and "not a measurement" in result["device"]
