"""Whether a looped row of an odd length should take its last step apart, measured
(codegen/reduction.py, config "peel_below").

    python -m benchmarks.experiments.peeled_steps OUT.json

Cross-entropy forward + backward (`cross_entropy`: `F.cross_entropy(logits.float(), target)`) over
[4096, V] bf16 logits, V a vocabulary of an odd length (GPT-2's 50257, BERT's 30522) and an even
one (32000), minicomp's whole call with the last step peeled (the default) and with every step
masked (`peel_below=1`), beside eager and Inductor, against the memory floor. Under a mask
`rindex < 50257` no two neighbouring lanes share a mask value the compiler can prove, so a
masked step loads and stores element by element.
"""

from __future__ import annotations

import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import cross_entropy

ROWS, WIDTHS = 4096, (50257, 30522, 32000)
SETTINGS = [("peeled", {}), ("masked", dict(peel_below=1))]
TINY = [(4, 1003)]


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for size, width in TINY if run.tiny else [(ROWS, w) for w in WIDTHS]:

        def make(rows, dtype, device, width=width):
            logits = torch.randn(rows, width, dtype=dtype, device=device, requires_grad=True)
            return [logits, torch.randint(0, width, (rows,), device=device)]

        sets = run.input_sets(make, size, torch.bfloat16)
        floor = measure.floor_bytes(sets[0], [cross_entropy(*sets[0])], True) / bandwidth * 1e3

        def record(impl, fn):
            ms = run.time_ms(fn, sets, backward=True)
            rows.append(dict(rows=size, width=width, impl=impl, ms=ms, x_floor=ms / floor))
            print(rows[-1], flush=True)

        if not run.tiny:
            record("eager", cross_entropy)
            record("inductor", torch.compile(cross_entropy))
        for label, setting in SETTINGS:
            harness.fresh_cache()
            with config.override(**setting):
                record(f"minicomp {label}", minicomp.jit(cross_entropy))
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
