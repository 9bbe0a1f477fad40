"""How many threads should compile kernels ahead: the decoder block's cold first training step.

    python -m benchmarks.experiments.compile_threads OUT.json

The bench's compile probe (`block`: `llama_block_fwbw` through torch.compile(backend=minicomp),
forward + backward) in a fresh process with empty caches, once per MINICOMP_COMPILE_THREADS
in THREADS (16 twice: first and last, for the noise), after one untimed run that fills Python's
bytecode cache (bench/run.py `probe_env`). Each row: the seconds of the first step and what the
probe said of its kernels: the first calls' waits for their compiles, their tuning, and the
number of Triton compiles. With --tiny: bias + ReLU on the CPU (nothing compiles there), one
row, no untimed run.
"""

from __future__ import annotations

import json
import tempfile

from benchmarks.experiments import harness
from minicomp.bench.run import probe_env, run_probe

THREADS = (16, 6, 2, 16)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    mode = [] if run.tiny else ["block"]
    rows = []
    with tempfile.TemporaryDirectory() as pycache:
        if not run.tiny:  # untimed: fills Python's bytecode cache (a smoke run times nothing)
            with tempfile.TemporaryDirectory() as scratch:
                run_probe("minicomp", mode, probe_env(scratch, pycache), device=run.device)
        for threads in THREADS[:1] if run.tiny else THREADS:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(probe_env(cache, pycache), MINICOMP_COMPILE_THREADS=str(threads))
                lines = run_probe("minicomp", mode, env, device=run.device)
                rows.append(dict(threads=threads, seconds=float(lines[-1]), kernels=json.loads(lines[-2])))
                print(rows[-1], flush=True)
    run.write(rows=rows)


if __name__ == "__main__":
    main()
