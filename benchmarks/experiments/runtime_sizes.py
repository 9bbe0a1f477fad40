"""What a runtime size costs: RoPE with its sequence length as a constant vs as a kernel argument.

    python -m benchmarks.experiments.runtime_sizes OUT.json

A kernel family (minicomp/codegen/families.py) turns the literals that differ
between two signatures into runtime arguments: for RoPE in the [B, H, S, D]
layout that is the `% (S*D)` of cos/sin's index, in [B, S, H, D] the `% S` of
the sequence variable. Here each RoPE form runs at the headline size twice:
compiled first (its literals stay constants), and compiled after a call at
another sequence length (its sequence-length literals are arguments). Timed
the way `minicomp bench` times, as a multiple of the memory floor.
"""

import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp.bench import measure
from minicomp.tools.workloads import rope

B, H, S, D = 8, 32, 2048, 128
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make(layout: str, backward: bool):
    def inputs(seq, dtype, device):
        shape = (B, H, seq, D) if layout == "BHSD" else (B, seq, H, D)
        q, k = (torch.randn(shape, dtype=dtype, device=device, requires_grad=backward) for _ in range(2))
        table = (seq, D) if layout == "BHSD" else (seq, 1, D)
        cos, sin = (torch.randn(table, dtype=dtype, device=device) for _ in range(2))
        return [q, k, cos, sin]

    return inputs


def main(argv=None):
    run = harness.parse(argv, __doc__)
    seq = 8 if run.tiny else S
    bandwidth = run.bandwidth()
    rows = []
    for layout in ("BHSD", "BSHD"):
        for backward in (False, True):
            for dname, dtype in DTYPES.items():
                inputs = make(layout, backward)
                sets = run.input_sets(inputs, seq, dtype)
                moved = measure.floor_bytes(sets[0], measure.flat_tensors(rope(*sets[0])), backward)
                for sizes in ("constants", "runtime"):
                    fn = minicomp.jit(rope)  # a new function: no kernel families yet
                    if sizes == "runtime":  # another sequence length first: S becomes an argument
                        fn(*inputs(seq // 2, dtype, run.device))
                    source = fn.source(*sets[0])
                    ms = run.time_ms(fn, sets, backward)
                    rows.append(
                        dict(
                            layout=layout,
                            backward=backward,
                            dtype=dname,
                            sizes=sizes,
                            ms=ms,
                            x_floor=ms / (moved / bandwidth * 1e3),
                            runtime_sizes=source.count("runtime sizes:"),
                        )
                    )
                    print(rows[-1], flush=True)
    run.write(bandwidth_gbps=bandwidth / 1e9, shape=[B, H, seq, D], rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
