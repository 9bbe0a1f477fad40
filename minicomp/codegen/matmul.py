"""Kernels of kind "matmul": an mm, addmm or bmm as a Triton template, its epilogue in the store
(plan/steps.py `MatmulKernel`, plan/matmul.py).

A program computes one [BLOCK_M, BLOCK_N] tile of the product (of one batch element, for bmm:
the batch is the outermost part of the program id), `tl.dot` over K in BLOCK_K steps into a
float32 accumulator; tiles are walked in grouped order (GROUP_M rows of tiles share b's tiles
in L2). The operands are read at their own strides, so a transposed operand (a backward's
`dy.t()`) is read in place. Sizes and strides are literals: rows and columns past M and N
wrap (`rm % M`) instead of being masked, and K's last step is masked only where BLOCK_K does
not divide K (decided by Triton as it compiles each tile).

The epilogue is written by the same lowering rules as every kernel: the writer's tile is
`[BLOCK_M, BLOCK_N]`, its index variables the tile's rows and columns (`x{d}` = `rm[:, None]`,
`rn[None, :]`, and the batch `pid_b`), and the product's value at that index is the
accumulator, rounded to the product's dtype as eager's matmul rounds it (an addmm's bias added
first, as cuBLAS adds it). Each store (the product where something else reads it, then the
epilogue's values) is evaluated at the element row-major order puts at the tile's element
(plan/matmul.py checked that this reads the product there) and stored at its own strides.

A product of one row whose b is read along K (a decoding step's `x @ W.T`) takes the *one-row
form* instead of tl.dot, whose tiles take at least 16 rows: a program multiplies b's
[BLOCK_K, BLOCK_N] tiles by the row's K chunks as a column and sums over K after the loop
(ROW_TILES: a few columns a program, long K steps), so the weight is read once at close to the
memory's speed.

A chained operand or a sibling product (plan/matmul_folding.py) is computed by its own K loop
at the tile that reads it (codegen/matmul_operands.py `folded_product`): a chain's at the operand's [BLOCK_M,
BLOCK_K] tile inside the K loop (nested to any depth), a sibling's at the epilogue's tile.

The kernel is written for each of the launch's tile shapes (`runtime/launch_spec.py`
`matmul_tiles`, at most 5): `TILE` picks one, chosen on a GPU by timing them on the first call
(tuning.py) and remembered in the tuning cache. Template: matmul.py.j2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.codegen.matmul_operands import (
    RESERVED,
    OperandWriter,
    folded_product,
    product_value,
    varies_with,
)
from minicomp.codegen.matmul_tiles import chain_tiles, fitting, folded_bytes
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, FloorDiv, IterationSpace, Mod, Var
from minicomp.lowering.ops.views import reshape_index
from minicomp.plan import matmul_reads as planning
from minicomp.plan.fusion import Plan
from minicomp.plan.steps import MatmulKernel
from minicomp.runtime.launch_spec import MatmulLaunch, Tile, matmul_tiles, one_row


@dataclass(kw_only=True)
class MatmulSource(KernelSource):
    """A matmul kernel's text and its launch fields."""

    kind: ClassVar[str] = "matmul"
    template: ClassVar[str] = "matmul.py.j2"
    renamable: ClassVar[bool] = False  # a_pointer, b_pointer name its parameters

    batch: int
    m: int
    n: int
    k: int
    tiles: tuple[Tile, ...]
    row: bool  # the one-row form (launch_spec.one_row): no tl.dot, sums over K after the loop
    a_strides: tuple[int, int]
    b_strides: tuple[int, int]
    a_pointer: str  # the operands' pointer parameters
    b_pointer: str
    a_base: str  # `pid_b * stride + ` of a batched operand, else ""
    b_base: str
    precision: str  # tl.dot's input_precision argument, for float32
    upcast: str  # `.to(tl.float32)` of 16-bit operands in Triton's interpreter, whose tl.dot reads bf16 wrong
    a_prologue: list[str] = field(default_factory=list)  # the lines that compute an operand inline
    b_prologue: list[str] = field(default_factory=list)  # (in the K loop: plan/matmul.py `_prologues`)
    piece: bool = False  # a piece of a shared launch (codegen/row_products.py): `pid` a parameter, no Launch

    def launch_spec(self) -> MatmulLaunch:
        return MatmulLaunch(batch=self.batch, m=self.m, n=self.n, k=self.k, tiles=self.tiles)


def write(plan: Plan, kernel: MatmulKernel) -> MatmulSource:
    return MatmulWriter(plan, kernel).write()


class MatmulWriter(KernelWriter):
    tile = "[BLOCK_M, BLOCK_N]"
    root_mask = "mask"
    reserved = RESERVED

    def __init__(self, plan: Plan, kernel: MatmulKernel):
        self.product = plan.graph[kernel.matmul]
        super().__init__(plan, kernel, IterationSpace(self.product.meta.shape))
        self.root = tuple(self.space.var(d) for d in range(len(kernel.shape)))
        self.batched = len(kernel.shape) == 3
        self.siblings = {k.matmul: (i, k) for i, k in enumerate(kernel.siblings)}  # computed at the tile

    def fresh(self, hint: str) -> str:
        """A node named like one of the template's own variables (an input `mask`, `b`) takes another
        name: the template's are still read after the epilogue's lines begin."""
        return super().fresh(f"{hint}_" if hint in self.reserved else hint)

    def load_mask(self, index, mask: tuple[str, ...]) -> str:
        """A load that varies along one axis of the tile only (a bias: its columns) is a row or a
        column of it, masked by that axis alone: [1, BLOCK_N] loads, not BLOCK_M copies of them."""
        rank = len(self.kernel.shape)
        rows, cols = (any(varies_with(e, d) for e in index) for d in (rank - 2, rank - 1))
        base = "nmask" if cols and not rows else "mmask" if rows and not cols else "mask"
        return " & ".join((base,) + mask)

    def address(self, expr: Expr) -> str:
        return expr.render(self.atom_name)  # (no flat `offsets` here: each variable is the tile's)

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if name == self.kernel.matmul or name in self.siblings:  # plan/matmul.py: read only at the tile's element
            if not planning.at_product(index, self.root) or mask:
                raise NotImplementedError(f"{name} is read at {index}, not at its tile's element {self.root}")
            if name == self.kernel.matmul:
                return self.memo[(name, self.root, ())]
            i, sibling = self.siblings[name]
            return folded_product(self, sibling, ("BLOCK_M", "BLOCK_N"), "ram", "rbn", f"s{i}", self.root)
        return super()._evaluate(name, index, mask)

    def write(self) -> MatmulSource:
        graph, e = self.graph, self.kernel.matmul
        meta = self.product.meta
        a, b, bias = planning.operands(graph, e)
        self.pointers = {x: f"{x}_ptr" for x in (a, b) if x not in self.kernel.prologue}
        precision = _precision(meta.dtype, meta.device)
        upcast = ".to(tl.float32)" if meta.device.type == "cpu" and meta.dtype in dtypes.LOW_PRECISION else ""
        self.dot = (precision, upcast)
        writers = {
            role: OperandWriter(
                self.plan,
                self.kernel,
                x,
                role,
                self.pointers,
                used=self.used,
                chained=self.kernel.chained if role == "a" else (),
                dot=self.dot,
            )
            for role, x in (("a", a), ("b", b))
            if x in self.kernel.prologue
        }
        prologues = {role: writer.lines_for() for role, writer in writers.items()}
        loaded = {  # bytes an operand's tile element loads from memory a step
            role: writers[role].tile_bytes() if role in writers else graph[x].meta.dtype.itemsize
            for role, x in (("a", a), ("b", b))
        }
        self.memo[(e, self.root, ())] = product_value(self, e, "acc", self.root)
        outs = out_pointers(self.kernel.stores)
        stores = []
        for name, out in outs.items():
            store_meta = graph[name].meta
            index = reshape_index(self.root, meta.shape, store_meta.shape)
            value = self.value(name, index)
            offset = Expr()
            for i, stride, extent in zip(index, self.plan.strides[name], store_meta.shape):
                if extent > 1:
                    offset = offset + i * stride
            address = paren(self.address(offset)) if not offset.is_const else "0"
            pointer = f"{out} + {address}"
            rank = len(self.kernel.shape)
            if not {rank - 2, rank - 1} <= _dims(offset):  # a product of one row (or column): no term for it
                pointer = f"tl.broadcast_to({pointer}, [BLOCK_M, BLOCK_N])"
            stores.append(f"tl.store({pointer}, {ops.cast(value, store_meta.dtype)}, mask=mask)")
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        am, bm = graph[a].meta, graph[b].meta
        m, n, k = meta.shape[-2], meta.shape[-1], am.shape[-1]
        wide = needs_wide_index(self.plan, meta.numel, args)
        row = one_row(m, bm.stride) and not self.kernel.chained and not self.kernel.siblings
        tiles = matmul_tiles(m, n, k, meta.dtype.itemsize, meta.device, row=row)
        if self.kernel.chained:
            tiles = chain_tiles(tiles, n, k)
        tiles = fitting(tiles, loaded, set(writers), meta.dtype.itemsize, folded_bytes(graph, self.kernel))
        return MatmulSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=meta.numel,
            header=self._header(m, n, k),
            body=self._definitions() + self.plain_loads + self.lines + stores,
            wide_index=wide,
            batch=meta.shape[0] if self.batched else 1,
            m=m,
            n=n,
            k=k,
            tiles=tiles,
            row=row,
            a_strides=am.stride[-2:],
            b_strides=bm.stride[-2:],
            a_pointer=self.pointers.get(a, ""),
            b_pointer=self.pointers.get(b, ""),
            a_prologue=prologues.get("a", []),
            b_prologue=prologues.get("b", []),
            a_base=f"pid_b * {am.stride[0]} + " if self.batched and am.shape[0] > 1 else "",
            b_base=f"pid_b * {bm.stride[0]} + " if self.batched and bm.shape[0] > 1 else "",
            precision=precision,
            upcast=upcast,
        )

    def _definitions(self) -> list[str]:
        """The index variables the epilogue uses: the batch, the tile's rows and its columns."""
        rank = len(self.kernel.shape)
        text = {rank - 2: "rm[:, None]", rank - 1: "rn[None, :]"}
        if self.batched:
            text[0] = "pid_b"
        return [f"x{v.dim} = {text[v.dim]}" for v in sorted(self.vars, key=lambda v: v.dim) if isinstance(v, Var)]

    def _header(self, m: int, n: int, k: int) -> list[str]:
        kern = self.kernel
        batch = f"{kern.shape[0]} x " if self.batched else ""
        epilogue = planning.epilogue_nodes(self.graph, kern)
        folded = [f"{k.matmul} ({how})" for k, how in planning.folded(kern)]
        chain = f"; computes {', '.join(folded)} too, never written" if folded else ""
        return [
            f"kernel {kern.index}: {kern.matmul} = aten.{self.product.op_name}, "
            f"then its epilogue {', '.join(epilogue) or '-'}{chain}",
            f"  matmul: {batch}[{m}, {k}] @ [{k}, {n}] in {str(self.product.meta.dtype).removeprefix('torch.')}, "
            f"accumulated in float32 ({kern.why})",
            f"  reads {', '.join(kern.loads)}; writes {', '.join(kern.stores)}",
        ]


def _dims(expr: Expr) -> set[int]:
    """The iteration dims an index reads (a decoding step's [1, n] product: the columns' alone)."""
    dims = set()
    for atom, _ in expr.terms:
        if isinstance(atom, Var):
            dims.add(atom.dim)
        elif isinstance(atom, (FloorDiv, Mod)):
            dims |= _dims(atom.expr)
    return dims


def _precision(dtype: torch.dtype, device: torch.device) -> str:
    """tl.dot's input precision: float32 as TF32 where torch allows it on CUDA (else IEEE)."""
    if dtype != torch.float32:
        return ""
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return f', input_precision="{"tf32" if tf32 else "ieee"}"'
