"""Which (block, num_warps) a generated kernel is launched with: the heuristics, and the
candidates a large kernel is tuned over (tuning.py times them on the first call).

  * kernels under config "tune_min_numel" elements: `heuristic`, 1024 elements per
    program and 4 warps (8 elements, two 16-byte float32 vectors, per thread); small
    ones (up to 4096 elements) 256 a program, so that per-element math spreads.
  * larger kernels: the best of config "launch_candidates", timed on the first call's
    real arguments and remembered on disk (`<cache>/tuning/`), so a second process
    reuses the choice.
  * Triton's interpreter (CPU) runs one program at a time in numpy: few, large
    programs are fastest there.
  * a kernel walked in parts (codegen/parts.py) writes `parts` elements per
    offset: its BLOCK_SIZE is the configuration's divided by `parts`, so that a
    program handles the same number of elements (launch_spec.py).
  * a reduction kernel is launched over rows: its block is XBLOCK, the rows a
    program takes; `reduction_heuristic` and `reduction_candidates` below, tuned
    the same way. A grouped one (`groups` programs, split_reductions.py) takes its
    group's rows XBLOCK at a time: its grid is fixed, XBLOCK is chosen for the group.
"""

from __future__ import annotations

import torch

from minicomp.tiles import rows_per_program  # the plan's split rule counts tiles of the same size

WARPS = (1, 2, 4, 8, 16, 32)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def heuristic(numel: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) without measuring."""
    if device.type == "cpu":
        return min(max(next_power_of_2(numel), 16), 1 << 16), 1
    if numel <= 4096:  # programs of 256 elements, 2 a thread: a small kernel whose elements cost
        return 256, 4  # much math (RoPE's cos and sin) spreads over SMs (4.0 -> 1.0 us at 4096)
    return 1024, 4


def reduction_heuristic(rows: int, row: int, device: torch.device) -> tuple[int, int]:
    """(XBLOCK, num_warps) of a reduction kernel whose programs hold `row` elements of a row."""
    if device.type == "cpu":
        return min(next_power_of_2(max(rows, 1)), max(1, (1 << 16) // row)), 1
    xblock = rows_per_program(rows, row)
    return xblock, min(16, max(1, xblock * row // 512))


def reduction_candidates(rows: int, row: int) -> list[tuple[int, int]]:
    """The (XBLOCK, num_warps) a reduction kernel is timed with: tiles of up to 8192 elements
    (rows a program from the largest such down to a quarter of it), warps for 256 to 2048
    elements of the tile a warp (benchmarks/experiments/reduction_configs.py)."""
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
