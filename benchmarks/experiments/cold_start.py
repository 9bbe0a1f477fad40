"""Where a first call's seconds go: the compile probe, cold and warm, under cProfile.

    python -m benchmarks.experiments.cold_start OUT.json

For bias + ReLU (`minicomp.jit`) and the decoder block's training step (`torch.compile`,
the bench's `llama_block_fwbw`), for minicomp and Inductor: the probe
(minicomp/bench/compile_probe.py) in a fresh process with empty caches (cold), then again
with them filled (warm), each clock starting before `import minicomp` or Inductor's first
`torch.compile`, Python's bytecode cached as the bench's compile rows have it (an untimed run
of each compiler fills it first). minicomp's cold runs are repeated under cProfile. OUT.json
gets the times, what minicomp's block probe said of its kernels (waits for compiles, tuning,
Triton compiles) and, per profiled run, the seconds the main thread spent inside the functions
that make up a compile; OUT.json's `.txt` sibling gets the top of each profile, and
OUT_<workload>.prof beside it the whole profile (pstats). cProfile sees only the main thread
(the compiles run in a pool) and inflates what it sees: compare profiled seconds with each
other, and the unprofiled times with Inductor's.
"""

from __future__ import annotations

import json
import pstats
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.experiments import harness
from minicomp.bench.run import probe_env

PROBE = Path(__file__).parents[2] / "minicomp" / "bench" / "compile_probe.py"

# (label, file suffix, function name) -> cumulative seconds, the profile's answer to "how long in X"
WATCHED = {
    "triton compile (triton.compile)": ("triton/compiler/compiler.py", "compile"),
    "launcher builds (compile_module_from_src)": ("build.py", "compile_module_from_src"),
    "kernel loads (_init_handles)": ("compiler.py", "_init_handles"),
    "tuning (Launch.choose)": ("launch.py", "choose"),
    "benchmarking (do_bench)": ("testing.py", "do_bench"),
    "subprocesses (ptxas, cc)": ("subprocess.py", "run"),
    "minicomp compile_graph": ("compiler.py", "compile_graph"),
    "capture (make_fx)": ("proxy_tensor.py", "make_fx"),
    "AOTAutograd (aot_function / aot_module_simplified)": ("aot_autograd.py", "aot_module_simplified"),
    "imports": ("<frozen importlib._bootstrap>", "_find_and_load"),
}


def probe(impl: str, mode: list[str], device: str, env: dict, profile: str | None = None) -> tuple[float, dict]:
    """Seconds of the first call, and what the probe said of its kernels (minicomp's block)."""
    env = dict(env, MINICOMP_PROBE_PROFILE=profile) if profile else env
    out = subprocess.run(
        [sys.executable, str(PROBE), impl, device, *mode], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise RuntimeError(f"probe {impl} {mode} failed:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    said = json.loads(lines[-2]) if len(lines) > 1 and lines[-2].startswith("{") else {}
    return float(lines[-1]), said


def watched(profile: str) -> dict[str, float]:
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    found = {}
    for label, (suffix, name) in WATCHED.items():
        found[label] = round(
            max(
                (row[3] for (file, _, fn), row in stats.items() if fn == name and file.endswith(suffix)),
                default=0.0,
            ),
            3,
        )
    return found


def main(argv=None):
    run = harness.parse(argv, __doc__)
    results, tops = {}, []
    cases = [("bias_relu", [])] + ([] if run.tiny else [("llama_block_fwbw", ["block"])])
    impls = ("minicomp",) if run.tiny else ("minicomp", "inductor")  # tiny: the block interpreted takes minutes
    with tempfile.TemporaryDirectory() as pycache:
        # untimed: fills Python's bytecode cache (bench/run.py probe_env); a smoke run times nothing
        for _, mode in [] if run.tiny else cases[-1:]:
            for impl in impls:
                with tempfile.TemporaryDirectory() as scratch:
                    probe(impl, mode, run.device, probe_env(scratch, pycache))
        for workload, mode in cases:
            for impl in impls:
                for profiled in (False, True) if impl == "minicomp" else (False,):
                    with tempfile.TemporaryDirectory() as cache:
                        env = probe_env(cache, pycache)
                        profile = f"{cache}/cold.prof" if profiled else None
                        key = f"{workload} {impl}" + (" (cProfile)" if profiled else "")
                        results[f"{key} cold"], said = probe(impl, mode, run.device, env, profile)
                        if said:
                            results[f"{key} cold, kernels"] = said
                        if profiled:
                            results[f"{key} cold, inside"] = watched(profile)
                            shutil.copy(profile, Path(run.out).with_name(f"{Path(run.out).stem}_{workload}.prof"))
                            text = pstats.Stats(profile, stream=(buffer := _Buffer()))
                            text.sort_stats("cumulative").print_stats(45)
                            tops.append(f"## {key} cold\n{buffer.text}")
                        else:
                            results[f"{key} warm"] = probe(impl, mode, run.device, env)[0]
                        print(key, {k: v for k, v in results.items() if k.startswith(key)}, flush=True)
    run.write(rows=[dict(run=k, result=v) for k, v in results.items()])
    Path(run.out).with_suffix(".txt").write_text("\n".join(tops))


class _Buffer:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text


if __name__ == "__main__":
    main()
