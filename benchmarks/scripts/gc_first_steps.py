"""Python's full garbage collections during a model's first steps, with minicomp's compiles pausing the
collector or not (gc_pause.py; issues #38, #42).

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/scripts/gc_first_steps.py [LAYERS] [--no-pause]

transformers' Llama (hidden 64, LAYERS layers, default 4; compile_cost.py's tiny model) through
`torch.compile(backend="minicomp")` on the CPU, in a fresh process: training steps at lengths 8, 9
(Dynamo's dynamic graph), 10 and 11. Per step: process CPU and wall seconds, the seconds and count of
generation-2 collections (`gc.callbacks`), and the process's peak RSS at the end. `--no-pause` runs
with config "pause_gc" off. Run it a few times each way: one step's CPU moves by 10-20% between
processes on the 2-core machine.
"""

import argparse
import gc
import json
import os
import resource
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from benchmarks.experiments import compile_cost  # noqa: E402
from minicomp import config  # noqa: E402
from minicomp.dispatch import dynamo  # noqa: E402

FULL = [0.0, 0, 0.0]  # seconds, count, the current collection's start


def _timed(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        FULL[2] = time.perf_counter()
    else:
        FULL[0] += time.perf_counter() - FULL[2]
        FULL[1] += 1


def main(layers: int, pause: bool) -> None:
    gc.callbacks.append(_timed)
    args = argparse.Namespace(hidden=64, heads=4, kv_heads=2, dtype="float32", batch=2)
    model = torch.compile(compile_cost.llama(layers, args, "cpu"), backend=dynamo.backend)
    rows = {}
    with config.override(pause_gc=pause):
        for length in (8, 9, 10, 11):
            FULL[:2] = [0.0, 0]
            cpu, wall = time.process_time(), time.perf_counter()
            ids = torch.randint(0, 128, (2, length))
            model(input_ids=ids, labels=ids).loss.backward()
            rows[length] = dict(
                cpu=round(time.process_time() - cpu, 2),
                wall=round(time.perf_counter() - wall, 2),
                full_gc_s=round(FULL[0], 3),
                full_gc=FULL[1],
            )
    rows["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(dict(pause_gc=pause, layers=layers, steps=rows)))


if __name__ == "__main__":
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(int(positional[0]) if positional else 4, "--no-pause" not in sys.argv)
