"""What codegen/assigned.py's check of a generated module costs, whole against by pieces (issue #42).

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/scripts/module_check_cost.py [LAYERS]

transformers' Llama (hidden 64, LAYERS layers, default 8; compile_cost.py's tiny model) through
`torch.compile(backend="minicomp")` on the CPU, training steps at lengths 8, 9 and 10, then 11: each
module written at length 11 is checked again, min of 5 process-CPU timings, whole
(`check_assigned`, as a module was checked before) and by pieces (`check_module`, with what the
earlier lengths' checks kept), and cProfile's top functions of the largest module's checks.
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.experiments import compile_cost  # noqa: E402
from minicomp.codegen import assigned, module  # noqa: E402


def main(layers: int) -> None:
    seen = []
    real = module.check_module

    def recording(text, pieces, checked):
        seen.append((text, list(pieces), dict(checked)))
        real(text, pieces, checked)

    module.check_module = recording
    args = argparse.Namespace(hidden=64, heads=4, kv_heads=2, dtype="float32", batch=2)
    step = compile_cost.stepper(compile_cost.llama(layers, args, "cpu"), "train", 2, "cpu")
    for length in (8, 9, 10):
        step(length)
    start = len(seen)
    step(11)
    for text, pieces, before in seen[start:]:
        whole = piecewise = float("inf")
        for _ in range(5):
            t = time.process_time()
            assigned.check_assigned(text)
            whole = min(whole, time.process_time() - t)
            t = time.process_time()
            assigned.check_module(text, pieces, dict(before))
            piecewise = min(piecewise, time.process_time() - t)
        lines = len(text.splitlines())
        print(f"{lines} lines, {len(pieces)} kernels: whole {whole * 1e3:.1f} ms, by pieces {piecewise * 1e3:.1f} ms")
    text, pieces, before = max(seen[start:], key=lambda s: len(s[0]))
    profile = cProfile.Profile()
    profile.enable()
    assigned.check_module(text, pieces, dict(before))
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
