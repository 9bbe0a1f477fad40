"""What a launch of one kernel kind needs to know: one small frozen class a kind.

A generated module hands its `Launch` the spec of its kernel's kind,

    launch_0 = Launch(mc_fused_add_relu_0, PointwiseLaunch(numel=4096), device="cuda:0")

and the spec answers everything that depends on the kind: the grid for a block,
the block's name in the kernel's signature, the configuration without measuring
(`heuristic`), the candidates a large kernel is timed over (`candidates`), whether
the first call times them (`tuned`), and the compile options. Its `repr` is the
Python expression that makes it, leaving out fields at their defaults, so the
generated line reads as the call it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from minicomp import config
from minicomp.runtime.launch_configs import heuristic, reduction_candidates, reduction_heuristic


class _Spec:
    """What every spec shares: a readable repr, and the default block name and options."""

    block_name: ClassVar[str] = "BLOCK_SIZE"  # the block's constexpr parameter
    options: ClassVar[dict] = {}  # Triton compile options of the kind

    def __repr__(self) -> str:
        fields = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default
        ]
        return f"{type(self).__name__}({', '.join(fields)})"

    def tuned(self) -> bool:
        """Whether the first call chooses the configuration by timing candidates (large kernels)."""
        return self.work >= config.get("tune_min_numel")


class _Elements(_Spec):
    """A kernel over a flat index space of `numel` elements, `parts` written per offset."""

    numel: int
    parts: int

    @property
    def work(self) -> int:
        """The elements the kernel writes (what decides whether it is tuned)."""
        return self.numel * self.parts

    def per_part(self, block: int) -> int:
        """BLOCK_SIZE for `block` elements a program when each offset writes `parts` of them
        (a power of two, as tl.arange needs: 3 parts of 1024 elements get 256 offsets)."""
        return max(1 << ((block // self.parts).bit_length() - 1), 16)

    def heuristic(self, device: torch.device) -> tuple[int, int]:
        if device.type == "cpu":  # the interpreter: no need to scale by parts
            return heuristic(self.numel, device)
        block, warps = heuristic(self.numel * self.parts, device)
        return self.per_part(block), warps

    def candidates(self) -> list[tuple[int, int]]:
        return [(self.per_part(block), warps) for block, warps in config.get("launch_candidates")]


@dataclass(frozen=True, repr=False)
class PointwiseLaunch(_Elements):
    """A pointwise kernel: `numel` elements, `parts` written per offset (codegen/parts.py); with
    `planes`, its planes walked `group` side by side (codegen/plane_order.py)."""

    numel: int
    parts: int = 1
    planes: int = 0
    group: int = 0

    def grid(self, block: int) -> int:
        if self.planes:  # every group of planes padded to `group` planes, each plane's blocks
            return -(-self.planes // self.group) * self.group * -(-(self.numel // self.planes) // block)
        return -(-self.numel // block)


@dataclass(frozen=True, repr=False)
class CombinedLaunch(_Elements):
    """Two independent pointwise kernels in one launch (templates/combo.py.j2): `pieces` holds
    each kernel's elements, its programs after the previous one's."""

    pieces: tuple[int, ...]
    parts: int = 1

    @property
    def numel(self) -> int:
        return sum(self.pieces)

    def grid(self, block: int) -> int:
        return sum(-(-n // block) for n in self.pieces)


@dataclass(frozen=True, repr=False)
class ScatterLaunch(_Elements):
    """A scatter kernel (codegen/scatter.py): `numel` values added atomically into its output.
    Never tuned by timing: every timed run would add them into the output once more."""

    numel: int
    parts: int = 1

    def grid(self, block: int) -> int:
        return -(-self.numel // block)

    def tuned(self) -> bool:
        return False


@dataclass(frozen=True, repr=False)
class ReductionLaunch(_Spec):
    """A reduction kernel: `rows` rows of `extent` elements, `rblock` of a row in a program's tile;
    launched over rows, XBLOCK of them a program. A grouped one has `groups` programs, each taking
    its group's rows XBLOCK at a time (split_reductions.py)."""

    rows: int
    rblock: int
    extent: int
    groups: int = 0

    block_name: ClassVar[str] = "XBLOCK"
    # A reduction kernel computes a value in one pass and again in the next (softmax: x * c for
    # the row's max, then x * c - max inside exp). Contracted into an FMA the second pass skips
    # the product's rounding, so x * c - max(x * c) is the rounding error, not 0 (about 1e23 when
    # the products are ~1e30: exp overflowed, NaN where eager gives 1). Every op rounds, as in eager.
    options: ClassVar[dict] = {"enable_fp_fusion": False}

    @property
    def numel(self) -> int:
        """The size a tuning record is named by: the rows."""
        return self.rows

    @property
    def work(self) -> int:
        return self.rows * max(self.rblock, self.extent)

    @property
    def program_rows(self) -> int:
        """The rows a program's XBLOCK is chosen for: all of them, or a grouped kernel's group."""
        return -(-self.rows // self.groups) if self.groups else self.rows

    def grid(self, block: int) -> int:
        return self.groups or -(-self.rows // block)

    def heuristic(self, device: torch.device) -> tuple[int, int]:
        return reduction_heuristic(self.program_rows, self.rblock, device)

    def candidates(self) -> list[tuple[int, int]]:
        return reduction_candidates(self.program_rows, self.rblock)


Tile = tuple[int, int, int, int, int]  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, pipeline stages)
GPU_TILES = {  # a matmul template's candidates on a GPU, by operand bytes (clamped to the sizes: matmul_tiles)
    2: ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4)),
    4: ((128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (32, 64, 32, 4, 4)),
}
# A product of at most 16 rows (a decoding step's [B, d] @ [d, n]) reads its weight once and does
# little else: few columns a program, so that its programs fill the SMs, and long K steps
SKINNY_TILES = ((16, 16, 256, 2, 4), (16, 32, 256, 4, 4), (16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 64, 4, 4))


# A product of one row whose b is read along K (x @ W.T, W an nn.Linear's [N, K] weight): no
# tl.dot (templates/matmul.py.j2 `row`), a few columns a program and long K steps. The first is the
# default: within 3% of the best of these at every decoding shape measured on an H200 (K 1024-5632,
# N 512-50257; docs/experiments.md), where cuBLAS took 1.1-2.2x the time
ROW_TILES = ((1, 2, 1024, 4, 3), (1, 1, 1024, 4, 3), (1, 2, 512, 8, 3), (1, 4, 512, 4, 3), (1, 1, 512, 8, 3))


def one_row(m: int, b_strides: tuple[int, ...]) -> bool:
    """Whether a product of `m` rows with operand b ([.., K, N] at `b_strides`) takes the template's
    one-row form: one row, b contiguous along K."""
    return m == 1 and b_strides[-2] == 1


def matmul_tiles(m: int, n: int, k: int, itemsize: int, device: torch.device, row: bool = False) -> tuple[Tile, ...]:
    """The tile shapes a matmul template is written for (at most 5: its launch times them on a
    GPU; SKINNY_TILES for at most 16 rows, ROW_TILES for the one-row form, `row`). Each block is at
    most the size's next power of two (at least 16, tl.dot's least, but in the one-row form);
    Triton's interpreter (CPU) runs one, as large as the sizes, up to 64."""

    def fit(block: int, size: int, least: int = 16) -> int:
        return min(block, max(least, 1 << max(size - 1, 0).bit_length()))

    if row:
        if device.type == "cpu":
            return ((1, fit(16, n, 1), fit(64, k, 1), 1, 1),)
        return tuple(dict.fromkeys((1, fit(bn, n, 1), fit(bk, k, 1), w, s) for _, bn, bk, w, s in ROW_TILES))
    if device.type == "cpu":
        return ((fit(64, m), fit(64, n), fit(64, k), 1, 1),)
    found, skinny = [], m <= 16
    for bm, bn, bk, warps, stages in SKINNY_TILES if skinny else GPU_TILES[4 if itemsize == 4 else 2]:
        large = fit(bm, m) * fit(bn, n) >= 128 * 128  # a clamped tile runs 4 warps (a skinny one its own)
        tile = (fit(bm, m), fit(bn, n), fit(bk, k), warps if skinny or large else 4, stages)
        if tile not in found:
            found.append(tile)
    return tuple(found)


@dataclass(frozen=True, repr=False)
class MatmulLaunch(_Spec):
    """A matmul template (codegen/matmul.py): `batch` products of [m, k] @ [k, n], a program a tile
    of the output. Its kernel is written for each of `tiles`; the launch's block `TILE` = 1 << i
    picks tile i (its constexpr if-chain), with that tile's warps. Small ones take the tile that
    gives the GPU enough programs; from config "tune_min_numel" multiply-adds the first call times
    every tile (tuning.py) and remembers the fastest."""

    batch: int
    m: int
    n: int
    k: int
    tiles: tuple[Tile, ...]

    block_name: ClassVar[str] = "TILE"

    @property
    def numel(self) -> int:
        """The size a tuning record is named by: the output's elements."""
        return self.batch * self.m * self.n

    @property
    def work(self) -> int:
        return self.batch * self.m * self.n * self.k

    def tile(self, code: int) -> Tile:
        return self.tiles[code.bit_length() - 1]

    def grid(self, code: int) -> int:
        bm, bn = self.tile(code)[:2]
        return self.batch * -(-self.m // bm) * -(-self.n // bn)

    def heuristic(self, device: torch.device) -> tuple[int, int]:
        """The largest tile that still gives about two programs an SM (132 on an H100), else the
        one giving the most programs; the one-row form's first tile (ROW_TILES)."""
        if device.type == "cpu":
            return 1, 1
        if self.tiles[0][0] == 1:  # the one-row form: its first tile (ROW_TILES)
            return 1, self.tiles[0][3]
        by_size = sorted(range(len(self.tiles)), key=lambda i: -self.tiles[i][0] * self.tiles[i][1])
        enough = [i for i in by_size if self.grid(1 << i) >= 264]
        i = enough[0] if enough else max(by_size, key=lambda i: self.grid(1 << i))
        return 1 << i, self.tiles[i][3]

    def candidates(self) -> list[tuple[int, int]]:
        return [(1 << i, tile[3]) for i, tile in enumerate(self.tiles)]


@dataclass(frozen=True, repr=False)
class RowProductsLaunch(_Spec):
    """Independent one-row matmul templates in one launch (templates/row_products.py.j2; a decoding
    step's q, k and v projections of one row): each piece's programs after the previous one's,
    each piece at its first tile, all at that tile's warps. Never tuned: a piece that would be
    (config "tune_min_numel") keeps a launch of its own."""

    pieces: tuple[MatmulLaunch, ...]

    block_name: ClassVar[str] = "TILE"

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.pieces)

    @property
    def work(self) -> int:
        return sum(p.work for p in self.pieces)

    def starts(self) -> list[int]:
        """The first program of each piece, then the grid."""
        found = [0]
        for p in self.pieces:
            found.append(found[-1] + p.grid(1))
        return found

    def grid(self, code: int) -> int:
        return self.starts()[-1]

    def heuristic(self, device: torch.device) -> tuple[int, int]:
        return (1, 1) if device.type == "cpu" else (1, self.pieces[0].tiles[0][3])

    def candidates(self) -> list[tuple[int, int]]:
        return [(1, self.pieces[0].tiles[0][3])]

    def tuned(self) -> bool:
        return False


LaunchSpec = PointwiseLaunch | CombinedLaunch | ReductionLaunch | ScatterLaunch | MatmulLaunch | RowProductsLaunch
