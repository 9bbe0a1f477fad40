"""Cold first calls with the compile worker processes and without them (threads alone), and
Inductor's, alternating, each in a fresh process with empty caches (issues #38, #40, #42).

    PYTHONPATH=. python benchmarks/scripts/compile_processes_ab.py OUT.json [ROUNDS] [MODES...]

MODES: compile_probe.py's modes ("" is bias + ReLU, "block" the decoder block's training
step; default both). Each round runs minicomp with MINICOMP_COMPILE_PROCESSES unset (workers,
as many as compile threads), minicomp with it 0, and Inductor, in turn, so that the machine's
drift falls on all three. OUT.json: every run's seconds and minicomp's compile breakdown.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

from minicomp.bench.run import probe_env, run_probe

VARIANTS = {"minicomp workers": ("minicomp", {}), "minicomp threads": ("minicomp", {"MINICOMP_COMPILE_PROCESSES": "0"})}
VARIANTS["inductor"] = ("inductor", {})


def main() -> None:
    out, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    modes = sys.argv[3:] or ["", "block"]
    runs = []
    with tempfile.TemporaryDirectory() as pycache:
        for mode in modes:  # untimed: fills Python's bytecode cache for both compilers
            for impl in ("minicomp", "inductor"):
                with tempfile.TemporaryDirectory() as cache:
                    run_probe(impl, [mode] if mode else [], probe_env(cache, pycache))
        for mode in modes:
            for r in range(rounds):
                for name, (impl, extra) in VARIANTS.items():
                    with tempfile.TemporaryDirectory() as cache:
                        lines = run_probe(impl, [mode] if mode else [], dict(probe_env(cache, pycache), **extra))
                    said = json.loads(lines[-2]) if len(lines) > 1 and lines[-2].startswith("{") else {}
                    runs.append(dict(mode=mode or "bias_relu", variant=name, round=r, s=float(lines[-1]), said=said))
                    print(runs[-1]["mode"], name, r, runs[-1]["s"], said, flush=True)
    summary = {}
    for run in runs:
        summary.setdefault(f"{run['mode']} {run['variant']}", []).append(run["s"])
    summary = {k: dict(median=statistics.median(v), runs=v) for k, v in summary.items()}
    for k, v in summary.items():
        print(f"{k}: median {v['median']:.2f} s {v['runs']}")
    with open(out, "w") as f:
        json.dump(dict(runs=runs, summary=summary), f, indent=1)


if __name__ == "__main__":
    main()
