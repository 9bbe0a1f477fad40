"""The tiles a matmul template is written for, fitted to shared memory (codegen/matmul.py).

`fitting` keeps the candidates whose pipeline fits (fewer stages where needed), counting what a
prologue holds and what the loops of chained and sibling products hold (`folded_bytes`).
A chain's own candidates (`chain_tiles`) take the whole hidden width as the K step and, where
they fit, all the product's columns, with rows and warps from CHAIN_TILES.
"""

from __future__ import annotations

from minicomp import config
from minicomp.codegen.matmul_operands import loop_step
from minicomp.plan import matmul_reads as planning
from minicomp.plan.steps import MatmulKernel
from minicomp.runtime.launch_spec import Tile

SHARED_BYTES = 220 * 1024  # shared memory a tile may plan for (an H100's or H200's 227 KiB, less some)


def fitting(
    tiles: tuple[Tile, ...], loaded: dict[str, int], computed: set[str], itemsize: int, folded=None
) -> tuple[Tile, ...]:
    """The tiles whose pipeline fits in shared memory: `stages` buffers of what each step loads
    (`loaded`: bytes an element of a's and b's tiles reads), plus the operands a prologue computes,
    held for tl.dot (compiled for sm_90 on the CPU, within 4% of Triton's own count), plus what the
    loops of chained and sibling products hold (`folded(bm, bn, bk)`: `folded_bytes`). A tile over it runs with fewer
    stages (at least 2), else is dropped; the smallest is kept in any case."""
    found = []
    for bm, bn, bk, warps, stages in tiles:
        held = ("a" in computed) * bm * bk * itemsize + ("b" in computed) * bk * bn * itemsize
        held += folded(bm, bn, bk) if folded else 0
        step = bm * bk * loaded["a"] + bk * bn * loaded["b"]
        while stages > 2 and stages * step + held > SHARED_BYTES:
            stages -= 1
        if stages * step + held <= SHARED_BYTES:
            found.append((bm, bn, bk, warps, stages))
    return tuple(found) or (min(tiles, key=lambda t: t[0] * t[1] * t[2])[:4] + (2,),)


CHAIN_TILES = ((128, 4), (64, 4), (128, 8), (256, 8), (32, 4))  # a chain's (rows, warps) candidates on a GPU


def chain_tiles(tiles: tuple[Tile, ...], n: int, k: int) -> tuple[Tile, ...]:
    """A chained kernel's tiles: its K step the whole hidden width (plan/matmul.py keeps it within
    config "matmul_chain_width"; the outer K loop runs once, so one stage), and its columns all of
    the product's where they fit that width too, so each program computes its rows of the hidden
    value once (a second column tile computes them again). Rows and warps from CHAIN_TILES (on
    the H200, 3 layers of width 128: 64 rows and 4 warps fastest at 8192 rows, 128 and 4 at 65536;
    docs/experiments.md); the interpreter's one tile as it was."""
    whole_n, whole_k = (max(16, 1 << max(size - 1, 0).bit_length()) for size in (n, k))
    wide = n > config.get("matmul_chain_width")
    if len(tiles) == 1:  # Triton's interpreter (matmul_tiles' CPU tile)
        bm, bn, _, warps, stages = tiles[0]
        return ((bm, bn if wide else whole_n, whole_k, warps, stages),)
    found = []
    for bm, bn, _, warps, _ in tiles if wide else [(bm, whole_n, 0, warps, 1) for bm, warps in CHAIN_TILES]:
        tile = (bm, bn, whole_k, warps, 1)
        if tile not in found:
            found.append(tile)
    return tuple(found)


def folded_bytes(graph, kernel: MatmulKernel):
    """Shared memory the loops of a kernel's folded products hold at tile (bm, bn, bk), or None
    where it has none: the largest loop's two operand tiles, [bm, step] and [step, columns],
    double-buffered where it steps more than once (Triton pipelines the innermost loops; loops
    that do not overlap reuse the memory). A chain's loop computes its consumer's operand a
    (columns: bk at the top, the consumer's own step further in); a sibling's, its host's
    product tile (columns: bn at the top)."""
    loops = []  # (bytes an element, buffers, step, columns)

    def walk(k: MatmulKernel, product_cols, a_cols) -> None:
        for inner, cols in [(i, a_cols) for i in k.chained] + [(s, product_cols) for s in k.siblings]:
            step = loop_step(graph, inner)
            a = planning.operands(graph, inner.matmul)[0]
            buffers = 2 if graph[a].meta.shape[-1] > step else 1
            loops.append((graph[inner.matmul].meta.dtype.itemsize, buffers, step, cols))
            walk(inner, cols, step)

    walk(kernel, "bn", "bk")
    if not loops:
        return None

    def held(bm: int, bn: int, bk: int) -> int:
        named = {"bn": bn, "bk": bk}
        return max(size * buffers * step * (bm + named.get(cols, cols)) for size, buffers, step, cols in loops)

    return held
