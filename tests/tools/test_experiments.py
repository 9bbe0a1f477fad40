"""Every experiment under benchmarks/experiments/ still runs: each on tiny CPU tensors (`--tiny`).

The numbers of a tiny run mean nothing; what is checked is that the script
runs end to end against today's compiler (its imports, the public accessors
it uses, its kernel variants) and writes its JSON. Each runs in a process of its
own, forked from one that imported torch and Triton already (tests/tools/preloaded.py).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.tools.preloaded import Preloaded

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(
    p.stem for p in (ROOT / "benchmarks" / "experiments").glob("*.py") if p.stem not in ("__init__", "harness")
)


def test_the_experiments_are_found():
    assert "launch_config" in EXPERIMENTS and len(EXPERIMENTS) >= 5


@pytest.fixture(scope="module")
def preloaded():
    server = Preloaded()
    yield server
    server.close()


@pytest.mark.slow  # 5-40 s each on a 2-core machine
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_tiny(name, tmp_path, preloaded):
    out = tmp_path / "out.json"
    env = dict(os.environ, TRITON_INTERPRET="1", MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    args = [str(out), "--tiny"]
    run = preloaded.run(f"benchmarks.experiments.{name}", args, env=env, cwd=ROOT, log=tmp_path / "log", timeout=600)
    assert run.returncode == 0 and not run.timed_out, run.output[-3000:]
    result = json.loads(out.read_text())
    assert result["rows"] and "not a measurement" in result["device"]


@pytest.mark.slow  # a server that imports torch and Triton
def test_a_preloaded_run_is_its_own_process(tmp_path):
    """A run gets its environment, working directory and arguments, its exit status and output
    come back, a hung run is killed at its time limit, and the server outlives each of them."""
    (tmp_path / "probe.py").write_text(
        "import os, sys, time\n"
        "print(os.environ['PROBE'], os.getcwd(), sys.argv[1:], __name__)\n"
        "time.sleep(float(sys.argv[1]))\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    server = Preloaded()
    try:
        env = dict(os.environ, PROBE="seen")
        done = server.run("probe", ["0", "3"], env=env, cwd=tmp_path, log=tmp_path / "log1", timeout=60)
        assert done.returncode == 3 and not done.timed_out
        assert done.output.split() == ["seen", str(tmp_path), "['0',", "'3']", "__main__"]
        hung = server.run("probe", ["60", "0"], env=env, cwd=tmp_path, log=tmp_path / "log2", timeout=1)
        assert hung.timed_out and hung.returncode == -signal.SIGKILL
        failed = server.run("missing_module", [], env=env, cwd=tmp_path, log=tmp_path / "log3", timeout=60)
        assert failed.returncode == 1 and "No module named missing_module" in failed.output
    finally:
        server.close()
