"""Program order for a large broadcast input: its planes walked side by side.

A pointwise kernel's programs take BLOCK_SIZE elements each, program i the
i-th block of the flat space, and the GPU runs them roughly in that order. An
input broadcast over the space's leading dims (RoPE's cos/sin [S, D] over q's
[B, H, S, D]; an attention mask [S, S] over the scores' [B, H, S, S]) is read
once per *plane* (one index of those leading dims), and in that order a line
of it is next read a whole plane of the other tensors later. When a plane
moves more bytes than the L2 keeps, every plane reads the broadcast input from
DRAM again: an extra read of it per plane.

So such a kernel walks `group` planes side by side: program `pid` takes plane
`(pid // (group * blocks)) * group + pid % group` and block `(pid % (group *
blocks)) // group` of it, where `blocks` is a plane's blocks. The programs that
read one block of the broadcast input then run next to each other, and it is
read from DRAM once a group of planes (a group of 32: 1/32 of an extra read).

Where the plain order keeps the input in L2 the side-by-side order is slower: its
concurrent programs touch `group` places in memory, not one
(benchmarks/experiments/broadcast_order.py). Hence the rule: walk planes side
by side only when the bytes between two reads of a line (a plane's other
traffic plus the broadcast input itself) exceed `config.get("reuse_bytes")`
(a third of the L2), and the broadcast input is at least 1/8 of a plane's other
traffic (so reading it again would cost more than the order's own price).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp import config
from minicomp.lowering.indexing import Expr, FloorDiv, Mod, Var, size


@dataclass(frozen=True)
class PlaneOrder:
    """`planes` (the product of the space's first `dims` dims) walked `group` at a time."""

    dims: int
    planes: int
    group: int
    reused: tuple[str, ...]  # the broadcast inputs each plane reads again
    reuse_bytes: int  # bytes the plain order moves between two reads of one of their elements

    def describe(self) -> str:
        return (
            f"programs walk {self.group} of its {self.planes} planes ({_dims_text(self.dims)}) side by side: "
            f"{', '.join(self.reused)} read again by each, {self.reuse_bytes / 2**20:.1f} MiB apart in the plain order"
        )


def _dims_text(dims: int) -> str:
    return "dim 0" if dims == 1 else f"dims 0-{dims - 1}"


def choose(shape: tuple[int, ...], offsets: dict[str, set], nbytes: dict[str, int]) -> PlaneOrder | None:
    """The order for a kernel over `shape` that loads each buffer at `offsets` (Exprs over the
    space's variables; None: a scalar) and moves `nbytes` of each buffer it reads or writes;
    None for the plain order. Planes are the space's first `dims` dims; a buffer is read once
    per plane when it does not vary along the innermost of them (an attention mask [B, 1, S, S]
    is read by each of a batch's heads; cos/sin [S, D] by every plane). The innermost plane
    boundary that qualifies wins."""
    total = sum(nbytes.values())
    varies = {name: _varies(at) for name, at in offsets.items()}
    for dims in range(len(shape) - 1, 0, -1):
        planes = math.prod(shape[:dims])
        slices: dict[str, int] = {}  # broadcast buffer -> the bytes of it one plane reads
        for name, along in varies.items():
            if along is None:
                continue
            first = dims  # the buffer does not vary along dims first .. dims - 1
            while first > 0 and first - 1 not in along:
                first -= 1
            readers = math.prod(shape[first:dims])  # planes that read one element of it
            if readers > 1:
                slices[name] = nbytes[name] * readers // planes
        if not slices:
            continue
        reused = sum(slices.values())
        plane = (total - sum(nbytes[name] for name in slices)) // planes  # one plane of everything else
        if 8 * reused >= plane and plane + reused > config.get("reuse_bytes"):
            group = min(planes, config.get("plane_group"))
            return PlaneOrder(dims, planes, group, tuple(slices), plane + reused)
    return None


def _varies(at: set) -> set[int] | None:
    """The dims a buffer loaded at the offsets `at` varies along; None where unknown or where it
    is a scalar (a None offset: one element, nothing to walk planes for)."""
    dims: set[int] = set()
    for offset in at:
        along = None if offset is None else _dims(offset)
        if along is None:
            return None
        dims |= along
    return dims


def _dims(expr: Expr) -> set[int] | None:
    """The iteration dims `expr` varies along; None where unknown (a gathered index, `Dyn`; a
    `Flat` run is only written when rendering)."""
    dims: set[int] = set()
    for atom, _ in expr.terms:
        inner = {atom.dim} if isinstance(atom, Var) else _dims(atom.expr) if isinstance(atom, FloorDiv | Mod) else None
        if inner is None:
            return None
        dims |= inner
    return dims


def prologue(order: PlaneOrder, inner: int, wide: bool, pairs: bool) -> list[str]:
    """The lines that define `offsets` and `mask` (and `pairs`, `pair_mask`) for `order`, each
    plane `inner` elements (marked sizes: a kernel family may make them runtime arguments)."""
    pid = "pid.to(tl.int64)" if wide else "pid"
    g, n, p = order.group, size(inner), size(order.planes)
    lines = [
        f"blocks = ({n} + BLOCK_SIZE - 1) // BLOCK_SIZE  # a plane's blocks",
        f"plane = {pid} // ({g} * blocks) * {g} + {pid} % {g}  # {g} planes side by side, a block of each in turn",
        f"start = ({pid} % ({g} * blocks)) // {g} * BLOCK_SIZE  # the block's first element in its plane",
        f"offsets = plane * {n} + start + tl.arange(0, BLOCK_SIZE)",
        f"mask = (start + tl.arange(0, BLOCK_SIZE) < {n}) & (plane < {p})",
    ]
    if pairs:
        lines += [
            f"pairs = 2 * (plane * {n} + start) + tl.arange(0, 2 * BLOCK_SIZE)",
            f"pair_mask = (2 * start + tl.arange(0, 2 * BLOCK_SIZE) < 2 * {n}) & (plane < {p})",
        ]
    return lines
