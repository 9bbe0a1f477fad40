"""One workload compiled by minicomp and called a few times: a target for Nsight Compute.

    ncu --kernel-name regex:mc_fused --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats python -m benchmarks.scripts.ncu_probe cross_entropy bfloat16 8192

Arguments: workload name (minicomp.tools.workloads), dtype, size. The first calls compile and tune;
skip past them with --launch-skip. Not an experiment (no result file of its own): ncu prints the result.
"""

from __future__ import annotations

import sys

import torch

import minicomp
from minicomp.tools.workloads import WORKLOADS


def main(argv):
    name, dtype, size = argv[0], getattr(torch, argv[1]), int(argv[2])
    work = WORKLOADS[name]
    inputs = work.make(size, dtype, "cuda")
    fn = minicomp.jit(work.fn)
    for _ in range(8):
        fn(*inputs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
