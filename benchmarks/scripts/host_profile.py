"""Where a suite step's host time goes, by Python function (issue #39).

    PYTHONPATH=. python benchmarks/scripts/host_profile.py MODEL STEP VARIANT [STEPS]

MODEL, STEP, VARIANT as in minicomp/bench/model_row.py (`real_step`). After 30 warm steps: the µs
a step back to back without a profiler, then STEPS (500) steps under cProfile, synchronized after
each as a decoding loop is: the 25 functions of most own time and of most cumulative time, µs a
step (cProfile's own cost inflates Python-heavy functions; compare variants by their shares).
"""

import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402


def main(name: str, step: str, variant: str, steps: int = 500) -> None:
    run = model_row.real_step(name, step, variant)
    for _ in range(30):
        run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        run()
        torch.cuda.synchronize()
    print(f"{name} {step} {variant}: {(time.perf_counter() - start) / steps * 1e6:.1f} us a synchronized step")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        run()
        torch.cuda.synchronize()
    profile.disable()
    for key in ("tottime", "cumtime"):
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats(key).print_stats(25)
        print(f"---- by {key} (seconds over {steps} steps) ----")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main(*sys.argv[1:4], *map(int, sys.argv[4:5]))
