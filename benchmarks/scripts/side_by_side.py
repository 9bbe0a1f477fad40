"""Suite steps of several variants in one process, timed in alternating rounds (issue #39).

    PYTHONPATH=. python benchmarks/scripts/side_by_side.py [--layers N] MODEL STEP VARIANT [VARIANT ...]

MODEL, STEP, VARIANT as in minicomp/bench/model_row.py (`real_step`); `--layers N` builds the
models with N transformer layers (model_specs.LAYERS, 2 by default). The suite runs a process per
row, and a host-bound step (GPT-2 decoding: ~0.1 ms of GPU work) moved by 10-30% between processes
of one machine; here every variant is built in one process, warmed (30 steps), then timed in 7
rounds of 300 steps each, synchronized after each step as a decoding loop is, the variants taking
turns within a round. Prints each round's µs a step and each variant's median over the rounds, and
its ratio to the first variant's.
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row, model_specs  # noqa: E402

ROUNDS, STEPS = 7, 300


def per_step_us(run) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        run()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / STEPS * 1e6


def main(name: str, step: str, *variants: str) -> None:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(variants))
    runs = {v: model_row.real_step(name, step, v) for v in variants}
    for run in runs.values():
        for _ in range(30):
            run()
    times = {v: [] for v in variants}
    for r in range(ROUNDS):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            times[v].append(per_step_us(runs[v]))
        print(f"round {r}: " + "  ".join(f"{v} {times[v][-1]:.1f}" for v in variants), flush=True)
    first = statistics.median(times[variants[0]])
    for v in variants:
        median = statistics.median(times[v])
        print(f"{name} {step} {v}: median {median:.1f} us a step, {median / first:.3f}x {variants[0]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--layers"]:
        model_specs.LAYERS, args = int(args[1]), args[2:]
    main(*args)
