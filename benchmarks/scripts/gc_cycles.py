"""Reference cycles a compiled step leaves for Python's garbage collector, and what they cost.

    PYTHONPATH=. python benchmarks/scripts/gc_cycles.py MODEL STEP VARIANT [VARIANT ...]

MODEL, STEP, VARIANT as in minicomp/bench/model_row.py (`real_step`). After 20 warm steps, per
variant: the objects one step leaves unreachable (found by `gc.collect()`, the collector off
during the step), by type, and the functions among them by name (a closure in a cycle names the
code that made it); then the step's µs back to back (300 steps) with the collector on and off.
Objects a step leaves in cycles count towards the collector's thresholds, and each collection of
the oldest generation walks every object the process holds (issue #38's host time). The GPU only.
"""

import collections
import gc
import os
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402


def cycles(run) -> dict:
    gc.collect()
    gc.disable()
    try:
        run()
        torch.cuda.synchronize()
        gc.set_debug(gc.DEBUG_SAVEALL)
        found = gc.collect()
        kinds = collections.Counter(type(o).__name__ for o in gc.garbage)
        names = collections.Counter(
            f"{o.__qualname__} ({o.__code__.co_filename.rsplit('/', 2)[-1]})"
            for o in gc.garbage
            if type(o).__name__ == "function"
        )
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    return dict(unreachable=found, kinds=kinds.most_common(8), functions=names.most_common(8))


def per_step_us(run, steps: int = 300) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def main(name: str, step: str, variants: list[str]) -> None:
    for variant in variants:
        torch._dynamo.reset()
        run = model_row.real_step(name, step, variant)
        for _ in range(20):
            run()
        print(name, step, variant, "one step's cycles:", cycles(run), flush=True)
        on = per_step_us(run)
        gc.disable()
        off = per_step_us(run)
        gc.enable()
        print(name, step, variant, f"step us back to back: gc on {on:.1f}, gc off {off:.1f}", flush=True)
        del run


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
