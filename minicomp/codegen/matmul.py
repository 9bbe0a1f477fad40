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

A chained operand (plan/matmul.py `_chainable`) or a sibling product (`_siblings`) is computed by
its own K loop at the tile that reads it (`product_loop`): a chain's at the operand's [BLOCK_M,
BLOCK_K] tile inside the K loop (nested to any depth), a sibling's at the epilogue's tile.

The kernel is written for each of the launch's tile shapes (`runtime/launch_spec.py`
`matmul_tiles`, at most 5): `TILE` picks one, chosen on a GPU by timing them on the first call
(tuning.py) and remembered in the tuning cache. Template: matmul.py.j2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from minicomp import config
from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, IterationSpace, Var, resolve_sizes
from minicomp.lowering.ops.core import broadcast_index
from minicomp.lowering.ops.views import reshape_index
from minicomp.plan import matmul as planning
from minicomp.plan.fusion import Plan
from minicomp.plan.steps import MatmulKernel
from minicomp.runtime.launch_spec import MatmulLaunch, Tile, matmul_tiles


@dataclass(kw_only=True)
class MatmulSource(KernelSource):
    """A matmul kernel's text and its launch fields."""

    kind: ClassVar[str] = "matmul"
    template: ClassVar[str] = "matmul.py.j2"

    batch: int
    m: int
    n: int
    k: int
    tiles: tuple[Tile, ...]
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

    def launch_spec(self) -> MatmulLaunch:
        return MatmulLaunch(batch=self.batch, m=self.m, n=self.n, k=self.k, tiles=self.tiles)


def write(plan: Plan, kernel: MatmulKernel) -> MatmulSource:
    return MatmulWriter(plan, kernel).write()


class MatmulWriter(KernelWriter):
    tile = "[BLOCK_M, BLOCK_N]"
    root_mask = "mask"
    reserved = (
        "pid", "pid_b", "pid_m", "pid_n", "tiles_m", "tiles_n", "group_size", "first_m", "group_m",
        "rm", "rn", "rk", "ram", "rbn", "a_ptrs", "b_ptrs", "acc", "a", "b", "k", "mask", "mmask", "nmask",
        "BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "GROUP_M", "TILE",
    )  # fmt: skip

    def __init__(self, plan: Plan, kernel: MatmulKernel):
        self.product = plan.graph[kernel.matmul]
        super().__init__(plan, kernel, IterationSpace(self.product.meta.shape))
        self.root = tuple(self.space.var(d) for d in range(len(kernel.shape)))
        self.batched = len(kernel.shape) == 3

    def fresh(self, hint: str) -> str:
        """A node named like one of the template's own variables (an input `mask`, `b`) takes another
        name: the template's are still read after the epilogue's lines begin."""
        return super().fresh(f"{hint}_" if hint in self.reserved else hint)

    def load_mask(self, index, mask: tuple[str, ...]) -> str:
        """A load that varies along one axis of the tile only (a bias: its columns) is a row or a
        column of it, masked by that axis alone: [1, BLOCK_N] loads, not BLOCK_M copies of them."""
        rank = len(self.kernel.shape)
        rows, cols = (any(_uses(e, d) for e in index) for d in (rank - 2, rank - 1))
        base = "nmask" if cols and not rows else "mmask" if rows and not cols else "mask"
        return " & ".join((base,) + mask)

    def address(self, expr: Expr) -> str:
        return expr.render(self.atom_name)  # (no flat `offsets` here: each variable is the tile's)

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        siblings = {k.matmul: (i, k) for i, k in enumerate(self.kernel.siblings)}
        if name == self.kernel.matmul or name in siblings:  # plan/matmul.py: read only at the tile's element
            if not planning.at_product(index, self.root) or mask:
                raise NotImplementedError(f"{name} is read at {index}, not at its tile's element {self.root}")
            if name == self.kernel.matmul:
                return self.memo[(name, self.root, ())]
            i, sibling = siblings[name]
            step = loop_step(self.graph, sibling)
            acc, lines = product_loop(self, sibling, ("BLOCK_M", "BLOCK_N"), "ram", "rbn", step, f"s{i}")
            self.lines += lines
            return product_value(self, name, acc, self.root)
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
                dot=(precision, upcast),
            )  # fmt: skip
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
            stores.append(f"tl.store({out} + {address}, {ops.cast(value, store_meta.dtype)}, mask=mask)")
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        am, bm = graph[a].meta, graph[b].meta
        m, n, k = meta.shape[-2], meta.shape[-1], am.shape[-1]
        wide = needs_wide_index(graph, meta.numel, args)
        tiles = matmul_tiles(m, n, k, meta.dtype.itemsize, meta.device)
        if self.kernel.chained:
            tiles = _chain_tiles(tiles, n, k)
        tiles = _fitting(tiles, loaded, set(writers), meta.dtype.itemsize, _folded_bytes(graph, self.kernel))
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


@dataclass(frozen=True)
class OperandTile:
    """Where an operand is evaluated: its tile's blocks (rows, columns), the 1-D indexes of its rows
    and of its columns (Triton source), and which of the two runs along K (masked at K, zero past
    it)."""

    blocks: tuple[str, str]  # ("BLOCK_M", "BLOCK_K")
    rows: str  # "ram"
    cols: str  # "(k + rk)"
    k_axis: int  # 0: the rows run along K (an operand b), 1: the columns (an operand a)

    @property
    def shape(self) -> str:
        return f"[{self.blocks[0]}, {self.blocks[1]}]"

    @staticmethod
    def of_role(role: str) -> OperandTile:
        """The template's own operand tiles: a's [BLOCK_M, BLOCK_K], b's [BLOCK_K, BLOCK_N] (rows
        and columns past M and N wrapped, as its loads are)."""
        if role == "a":
            return OperandTile(("BLOCK_M", "BLOCK_K"), "ram", "(k + rk)", 1)
        return OperandTile(("BLOCK_K", "BLOCK_N"), "(k + rk)", "rbn", 0)


class OperandWriter(KernelWriter):
    """The lines that compute an operand inside a K loop (a prologue): the operand evaluated
    through the lowering rules at the step's tile (`OperandTile`: `[BLOCK_M, BLOCK_K]` of a or
    `[BLOCK_K, BLOCK_N]` of b; rows wrapped as the template's loads are, K's tail masked and
    zero, as a load past K is), rounded to the operand's dtype as the tensor eager multiplies
    holds it, into the variable `result`. Its names end in `_<role>` (its index variables
    `i<role>0`, ...), apart from the epilogue's and the other operand's; its buffers are the
    kernel's parameters (`pointers`, shared) and its names are taken from one set (`used`).

    An operand that is a chain's hidden value (plan/matmul.py `_chainable`: `relu(x @ w1 + b1)`)
    reaches the inner matmul's product: its lines are that product's own K loop at this tile
    (`_chained_product`: the inner operands written by writers of roles `<role>a` and `<role>b`),
    then the inner epilogue as any pointwise value."""

    reserved = MatmulWriter.reserved

    def __init__(
        self,
        plan: Plan,
        kernel: MatmulKernel,
        name: str,
        role: str,
        pointers: dict[str, str],
        *,
        used: set[str],
        place: OperandTile | None = None,
        result: str | None = None,
        chained: tuple[MatmulKernel, ...] = (),
        dot: tuple[str, str] = ("", ""),
    ):
        self.operand, self.role = name, role
        self.place = place or OperandTile.of_role(role)
        self.tile = self.place.shape
        self.root_mask = f"kmask_{role}"
        super().__init__(plan, kernel, IterationSpace(plan.graph[name].meta.shape))
        self.pointers, self.used = pointers, used
        self.result = result or role
        self.chained = {k.matmul: k for k in chained}
        self.siblings = {s.matmul: s for k in chained for s in k.siblings}  # what a chained epilogue reads
        self.dot = dot  # (tl.dot's precision argument, the interpreter's upcast of 16-bit operands)
        self.rank = len(plan.graph[name].meta.shape)

    def fresh(self, hint: str) -> str:
        return super().fresh(f"{hint}_{self.role}")

    def atom_name(self, atom) -> str:
        if isinstance(atom, Var):
            self.vars.add(atom)
            return f"i{self.role}{atom.dim}"
        return super().atom_name(atom)

    def address(self, expr: Expr) -> str:
        return expr.render(self.atom_name)

    def tile_bytes(self) -> int:
        """Bytes each element of the operand's tile loads: the itemsizes of the buffers loaded at
        both of the tile's axes (a weight cast from float32: 4; a row like a scale's: none)."""
        dims = (self.rank - 2, self.rank - 1)
        return sum(
            self.graph[name].meta.dtype.itemsize
            for name, offsets in self.load_offsets.items()
            if any(o is not None and all(_uses(o, d) for d in dims) for o in offsets)
        )

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if name in self.chained or name in self.siblings:
            root = tuple(self.space.var(d) for d in range(self.rank))
            if not planning.at_product(index, root) or mask:
                raise NotImplementedError(f"{name} is read at {index}, not at the chained tile's element {root}")
            inner = self.chained.get(name) or self.siblings[name]
            return self._chained_product(
                inner, root, "" if name in self.chained else f"s{list(self.siblings).index(name)}"
            )
        return super()._evaluate(name, index, mask)

    def _chained_product(self, inner: MatmulKernel, root, tag: str = "") -> ops.Value:
        """The inner matmul's product (or a sibling its epilogue reads: `tag` names its loop) at
        this tile (`product_loop`; b's columns wrapped at its width: in bounds, and the columns past
        it are zeroed where the operand is)."""
        step = loop_step(self.graph, inner)
        place = self.place
        acc, lines = product_loop(self, inner, place.blocks, place.rows, place.cols, step, self.role + tag)
        self.lines += lines
        return product_value(self, inner.matmul, acc, root)

    def lines_for(self) -> list[str]:
        """The prologue: index variables, the K mask, the operand's lines, then `<result> = ...`."""
        meta = self.graph[self.operand].meta
        root = tuple(self.space.var(d) for d in range(self.rank))
        value = ops.cast(self.value(self.operand, root), meta.dtype)
        place = self.place
        rows, cols = f"{place.rows}[:, None]", f"{place.cols}[None, :]"
        text = {self.rank - 2: rows, self.rank - 1: cols}
        if self.rank == 3:
            text[0] = "pid_b"
        defs = [f"i{self.role}{v.dim} = {text[v.dim]}" for v in sorted(self.vars, key=lambda v: v.dim)]
        along_k = cols if place.k_axis == 1 else rows
        mask = f"{self.root_mask} = {along_k} < {meta.shape[-1] if place.k_axis == 1 else meta.shape[-2]}"
        zero = "0" if meta.dtype in (torch.int32, torch.int64) else "0.0"
        lines = [
            mask,
            *defs,
            *self.plain_loads,
            *self.lines,
            f"{self.result} = tl.where({self.root_mask}, {value}, {zero})",
        ]
        return [resolve_sizes(line) for line in lines]  # literals (a family varies the epilogue's only)


def loop_step(graph, inner: MatmulKernel) -> int:
    """The K chunk of a folded product's loop (a chain's, a sibling's): its whole K (a power of
    two) where its own operand a is chained, so each program computes that hidden value once;
    else 64 elements (32 in float32), as the template's own tiles step."""
    a = planning.operands(graph, inner.matmul)[0]
    k = graph[a].meta.shape[-1]
    whole = max(16, 1 << max(k - 1, 0).bit_length())
    if inner.chained:
        return whole
    return min(whole, 32 if graph[inner.matmul].meta.dtype == torch.float32 else 64)


def product_loop(
    writer: KernelWriter, inner: MatmulKernel, blocks: tuple[str, str], rows: str, cols: str, step: int, role: str
) -> tuple[str, list[str]]:
    """(the accumulator, the lines) of matmul `inner.matmul`'s product at a tile of `blocks` whose
    rows and columns are `rows` and `cols` (1-D index text): a K loop `k_<role>` in chunks of
    `step`, its operands written by OperandWriters of roles `<role>a` and `<role>b` (loads, or
    their own prologues and chains; b's columns wrapped at the product's width, so in bounds).
    The writer's pointers, names and loads are shared; `writer.dot` is tl.dot's precision
    argument and the interpreter's upcast."""
    graph = writer.graph
    a, b, _ = planning.operands(graph, inner.matmul)
    k = graph[a].meta.shape[-1]
    width = graph[inner.matmul].meta.shape[-1]
    acc, kvar, rk = writer.fresh("acc"), writer.fresh("k"), writer.fresh("rk")
    places = {
        "a": OperandTile((blocks[0], str(step)), rows, rk, 1),
        "b": OperandTile((str(step), blocks[1]), rk, f"({cols} % {width})", 0),
    }
    body = [f"{rk} = {kvar} + tl.arange(0, {step})"]
    names = {}
    for part, x in (("a", a), ("b", b)):
        names[part] = writer.fresh(part)
        operand = OperandWriter(
            writer.plan, writer.kernel, x, role + part, writer.pointers, used=writer.used, place=places[part],
            result=names[part], chained=inner.chained if part == "a" else (), dot=writer.dot,
        )  # fmt: skip
        operand.loads = writer.loads
        body += operand.lines_for()
    precision, upcast = writer.dot
    body.append(f"{acc} = tl.dot({names['a']}{upcast}, {names['b']}{upcast}, {acc}{precision})")
    lines = [
        f"{acc} = tl.full([{blocks[0]}, {blocks[1]}], 0.0, dtype=tl.float32)  # {inner.matmul} at this tile",
        f"for {kvar} in tl.range(0, {k}, {step}):",
        *("    " + line for line in body),
    ]
    return acc, lines


def product_value(writer: KernelWriter, e: str, acc: str, root) -> ops.Value:
    """Matmul `e`'s product at a tile's element from its float32 accumulator `acc`: alpha times
    it, plus beta times an addmm's bias, rounded to the product's dtype as eager's result is."""
    graph = writer.graph
    meta = graph[e].meta
    alpha, beta = planning.scales(graph, e)
    bias = planning.operands(graph, e)[2]
    code = acc if alpha == 1 else f"{acc} * {float(alpha)!r}"
    if bias is not None and beta != 0:
        writer.loads.add(bias)
        term = writer.value(bias, broadcast_index(root, graph[bias].meta.shape))
        added = term.code if beta == 1 else f"{term.code} * {float(beta)!r}"
        code = f"{code} + {added}"
    if meta.dtype in dtypes.LOW_PRECISION:
        code = f"({code}).to({dtypes.triton_dtype(meta.dtype)}).to(tl.float32)"
    elif code == acc:
        return ops.Value(acc, torch.float32)
    return writer.temp(code, torch.float32, e, f"aten.{graph[e].op_name}: the product, rounded as eager's")


SHARED_BYTES = 220 * 1024  # shared memory a tile may plan for (an H100's or H200's 227 KiB, less some)


def _fitting(
    tiles: tuple[Tile, ...], loaded: dict[str, int], computed: set[str], itemsize: int, folded=None
) -> tuple[Tile, ...]:
    """The tiles whose pipeline fits in shared memory: `stages` buffers of what each step loads
    (`loaded`: bytes an element of a's and b's tiles reads), plus the operands a prologue computes,
    held for tl.dot (compiled for sm_90 on the CPU, within 4% of Triton's own count), plus what the
    loops of chained and sibling products hold (`folded(bm, bn, bk)`: `_folded_bytes`). A tile over it runs with fewer
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


def _chain_tiles(tiles: tuple[Tile, ...], n: int, k: int) -> tuple[Tile, ...]:
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


def _folded_bytes(graph, kernel: MatmulKernel):
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


def _uses(expr: Expr, dim: int) -> bool:
    """Whether `expr` varies with index variable `dim`."""

    def has(atom) -> bool:
        if isinstance(atom, Var):
            return atom.dim == dim
        inner = getattr(atom, "expr", None)
        return inner is not None and any(has(a) for a, _ in inner.terms)

    return any(has(atom) for atom, _ in expr.terms)


def _precision(dtype: torch.dtype, device: torch.device) -> str:
    """tl.dot's input precision: float32 as TF32 where torch allows it on CUDA (else IEEE)."""
    if dtype != torch.float32:
        return ""
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return f', input_precision="{"tf32" if tf32 else "ieee"}"'
