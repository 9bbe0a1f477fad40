"""A suite step's host time, and the part of it inside minicomp's compiled call (issues #38, #39).

    PYTHONPATH=. python benchmarks/scripts/host_split.py MODEL STEP VARIANT

MODEL, STEP, VARIANT as in minicomp/bench/model_row.py (`real_step`). After 30 warm steps: 300
steps back to back, three times, then 300 each synchronized and 300 with the garbage collector off;
each line gives the µs a step (wall, no profiler), the µs a step spent inside minicomp's boxed
callable of each Dynamo graph (for a minicomp variant: what the generated call and its CUDA graph
replay cost; the rest is Dynamo, AOTAutograd's wrappers and the model's own Python) and how many
such calls a step makes.
"""

import gc
import os
import sys
import tempfile
import threading
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402

inner = [0.0, 0]


def _timing_graphed():
    """minicomp's compiled callables, each timed (graphed_calls.graphed wraps every one it returns)."""
    from minicomp.dispatch import graphed_calls

    graphed = graphed_calls.graphed

    def timed_graphed(*args, **kwargs):
        run = graphed(*args, **kwargs)

        def timed(call_args):
            start = time.perf_counter()
            out = run(call_args)
            inner[0] += time.perf_counter() - start
            inner[1] += 1
            return out

        timed._boxed_call = True
        return timed

    graphed_calls.graphed = timed_graphed


def per_step(run, steps: int, each_synchronized: bool = False) -> tuple:
    torch.cuda.synchronize()
    inner[:] = [0.0, 0]
    start = time.perf_counter()
    for _ in range(steps):
        run()
        if each_synchronized:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    torch.cuda.synchronize()
    return round(wall / steps * 1e6, 1), round(inner[0] / steps * 1e6, 1), inner[1] / steps


def main(name: str, step: str, variant: str) -> None:
    if variant.startswith("minicomp"):
        _timing_graphed()
    run = model_row.real_step(name, step, variant)
    for _ in range(30):
        run()
    torch.cuda.synchronize()
    print("threads:", [t.name for t in threading.enumerate()])
    for _ in range(3):
        print(name, step, variant, "back to back: step us, inside minicomp us, its calls:", per_step(run, 300))
    print("each synchronized:", per_step(run, 300, each_synchronized=True))
    gc.disable()
    print("no gc:", per_step(run, 300))
    gc.enable()


if __name__ == "__main__":
    main(*sys.argv[1:4])
