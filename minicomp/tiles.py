"""The rows a program of a reduction kernel takes when nothing is measured.

Shared by the plan, which counts a reduction's tiles to decide whether to split it
(plan/split_reductions.py), and the runtime, which launches an untuned reduction kernel
with that many rows a program (runtime/launch_configs.py `reduction_heuristic`).
"""

from __future__ import annotations

TILE_ELEMENTS = 2048  # elements of a reduction kernel's tile: rows a program x the row elements it holds


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def rows_per_program(rows: int, row: int) -> int:
    """XBLOCK without measuring: a tile of about TILE_ELEMENTS elements, `row` of each row."""
    return min(next_power_of_2(max(rows, 1)), max(1, TILE_ELEMENTS // row))
