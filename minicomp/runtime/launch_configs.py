"""Which (block, num_warps) a generated kernel is launched with: the heuristics, and the
candidates a large kernel is tuned over (launch.py times them on the first call).

Launch configuration, measured on an H200 (benchmarks/experiments/):
  * kernels under 16M elements: 1024 elements per program and 4 warps (8
    elements, two 16-byte float32 vectors, per thread); tiny ones one program.
  * larger kernels: the best of config "launch_candidates", timed on the first call's real
    arguments and remembered on disk (`<cache>/tuning/`), so a second process
    reuses the choice. The spread is real: RoPE in bf16 ran 1.09x the memory
    floor at 1024/4 and 1.03x at 512/4, while bias+ReLU in bf16 went the
    other way (1.08x and 1.34x).
  * Triton's interpreter (CPU) runs one program at a time in numpy: few, large
    programs are fastest there.
  * a kernel walked in parts (codegen/split.py) writes `parts` elements per
    offset: its BLOCK_SIZE is the configuration's divided by `parts`, so that a
    program handles the same number of elements.
  * a reduction kernel (`row` = its RBLOCK) is launched over rows: its block is
    XBLOCK, the rows a program takes; `reduction_heuristic` and
    `reduction_candidates` below, tuned the same way. A grouped one (`groups`
    programs, split_reductions.py) takes its group's rows XBLOCK at a time:
    its grid is fixed, XBLOCK is chosen for the group.
"""

from __future__ import annotations

import torch

WARPS = (1, 2, 4, 8, 16, 32)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def heuristic(numel: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) without measuring."""
    if device.type == "cpu":
        return min(max(next_power_of_2(numel), 16), 1 << 16), 1
    if numel <= 4096:
        return max(next_power_of_2(numel), 128), 4 if numel > 1024 else 1
    return 1024, 4


def reduction_heuristic(rows: int, row: int, device: torch.device) -> tuple[int, int]:
    """(XBLOCK, num_warps) of a reduction kernel whose programs hold `row` elements of a row."""
    if device.type == "cpu":
        return min(next_power_of_2(max(rows, 1)), max(1, (1 << 16) // row)), 1
    xblock = rows_per_program(rows, row)
    return xblock, min(16, max(1, xblock * row // 512))


def rows_per_program(rows: int, row: int) -> int:
    """XBLOCK without measuring: a tile of about 2048 elements, `row` of each row."""
    return min(next_power_of_2(max(rows, 1)), max(1, 2048 // row))


def reduction_candidates(rows: int, row: int) -> list[tuple[int, int]]:
    """The (XBLOCK, num_warps) a reduction kernel is timed with: tiles of up to 8192 elements
    (rows a program from the largest such down to a quarter of it), warps for 256 to 2048
    elements of the tile a warp. The range is measured (benchmarks/experiments/reduction_configs.py,
    H200): cross-entropy's looped rows are fastest at 2048 a warp, RMSNorm's persistent ones and
    column sums at 256-1024."""
    top = min(next_power_of_2(max(rows, 1)), max(1, 8192 // row))
    found = []
    for xblock in (top, top // 2, top // 4):
        if xblock < 1:
            continue
        for per_warp in (2048, 1024, 512, 256):
            warps = min(32, max(1, xblock * row // per_warp))
            if (xblock, warps) not in found:
                found.append((xblock, warps))
    return found


def valid_config(value) -> tuple[int, int]:
    """(BLOCK_SIZE or XBLOCK, num_warps) read from a tuning record, checked: a power of two up to
    65536 and a warp count Triton accepts; anything else raises ValueError."""
    block, warps = value
    if (
        type(block) is not int
        or type(warps) is not int
        or not 1 <= block <= 1 << 16
        or block & (block - 1)
        or warps not in WARPS
    ):
        raise ValueError(f"launch config {value!r} is not a power-of-two block and a warp count")
    return block, warps
