"""The host's time in a chunked loss (issue #41: chunked_rows.py), by method, in a suite training step.

    PYTHONPATH=. python benchmarks/scripts/chunked_host.py MODEL VARIANT

VARIANT as in minicomp/bench/model_row.py (`minicomp:chunk_budget_bytes=134217728` chunks the
loss). After 5 warm steps, 20 steps each started with the GPU held busy by a long sleep (so no
launch waits: the host's own time): the median ms a step takes to return, and the ms a step spent
in each of `Region`'s methods (wall clock around each call; nested calls count in both).
"""

import collections
import functools
import os
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402
from minicomp.dispatch.chunked_rows import Region  # noqa: E402

STEPS = 20
METHODS = ("forward_with_gradients", "tail_weights", "_chunk_gradients", "_matmul_grads", "padded", "logits")
spent, calls = collections.defaultdict(float), collections.Counter()


def timed(fn, label: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            calls[label] += 1

    return wrapper


class _Timed:
    """A chunk's compiled joint whose calls are timed; its attributes (`taken`) read through."""

    def __init__(self, joint):
        self.joint = joint

    def __getattr__(self, name):
        return getattr(self.joint, name)

    def __call__(self, *args):
        return timed(self.joint, "joint call")(*args)


def main(name: str, variant: str) -> None:
    for method in METHODS:
        setattr(Region, method, timed(getattr(Region, method), method))
    joint = Region.joint
    Region.joint = lambda self, *a, **k: _Timed(joint(self, *a, **k))
    run = model_row.real_step(name, "train", variant)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    spent.clear()
    calls.clear()
    host = []
    for _ in range(STEPS):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)
        start = time.perf_counter()
        run()
        host.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    print(f"{name} {variant}: host ms a step (GPU held busy), median {sorted(host)[STEPS // 2] * 1e3:.2f}")
    for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {label:24s} {calls[label] / STEPS:5.1f} calls a step {seconds / STEPS * 1e3:8.3f} ms a step")


if __name__ == "__main__":
    main(*sys.argv[1:])
