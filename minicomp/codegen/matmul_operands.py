"""A matmul template's operands computed inside its K loops (codegen/matmul.py's helpers).

`OperandWriter` writes an operand at a step's tile through the lowering rules: a prologue (the
operand's pointwise producers inlined), or a chain's hidden value, whose inner product is a K
loop of its own at that tile (`folded_product`, nested to any depth: plan/matmul_folding.py).
`folded_product` also computes a sibling product at the epilogue's tile; `product_value` turns an
accumulator into the product eager would hold (alpha, beta and bias, the product's rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.codegen.kernel import KernelWriter
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, IterationSpace, Var, resolve_sizes
from minicomp.lowering.ops.core import broadcast_index
from minicomp.plan import matmul_reads as planning
from minicomp.plan.fusion import Plan
from minicomp.plan.steps import MatmulKernel

# the names templates/matmul.py.j2 defines: no value of a matmul kernel may take one
RESERVED = (
    "pid", "pid_b", "pid_m", "pid_n", "tiles_m", "tiles_n", "group_size", "first_m", "group_m",
    "rm", "rn", "rk", "ram", "rbn", "a_ptrs", "b_ptrs", "acc", "a", "b", "k", "mask", "mmask", "nmask",
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "GROUP_M", "TILE",
)  # fmt: skip


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

    An operand that is a chain's hidden value (plan/matmul_folding.py `chainable`: `relu(x @ w1 + b1)`)
    reaches the inner matmul's product: its lines are that product's own K loop at this tile
    (`folded_product`: the inner operands written by writers of roles `<role>a` and `<role>b`; b's
    columns wrapped at its width, so in bounds, and zeroed past it where the operand is),
    then the inner epilogue as any pointwise value."""

    reserved = RESERVED

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
            if any(o is not None and all(varies_with(o, d) for d in dims) for o in offsets)
        )

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        if name in self.chained or name in self.siblings:
            root = tuple(self.space.var(d) for d in range(self.rank))
            if not planning.at_product(index, root) or mask:
                raise NotImplementedError(f"{name} is read at {index}, not at the chained tile's element {root}")
            inner = self.chained.get(name) or self.siblings[name]
            tag = "" if name in self.chained else f"s{list(self.siblings).index(name)}"
            place = self.place
            return folded_product(self, inner, place.blocks, place.rows, place.cols, self.role + tag, root)
        return super()._evaluate(name, index, mask)

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
        result = f"tl.where({self.root_mask}, {value}, {zero})"
        if not {self.rank - 2, self.rank - 1} <= {v.dim for v in self.vars}:  # no term for an axis of
            result = f"tl.broadcast_to({result}, {self.tile})"  # the tile: a row [1, K], a broadcast
        lines = [mask, *defs, *self.plain_loads, *self.lines, f"{self.result} = {result}"]
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


def folded_product(
    writer: KernelWriter, inner: MatmulKernel, blocks: tuple[str, str], rows: str, cols: str, role: str, root
) -> ops.Value:
    """Matmul `inner.matmul`'s product at a tile of `blocks` whose rows and columns are `rows` and
    `cols` (1-D index text), its lines added to `writer`'s: a K loop `k_<role>` in chunks of
    `loop_step`, its operands written by OperandWriters of roles `<role>a` and `<role>b` (loads,
    or their own prologues and chains; b's columns wrapped at the product's width, so in bounds),
    then `product_value` at `root`. The writer's pointers, names and loads are shared;
    `writer.dot` is tl.dot's precision argument and the interpreter's upcast."""
    graph = writer.graph
    step = loop_step(graph, inner)
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
    writer.lines += [
        f"{acc} = tl.full([{blocks[0]}, {blocks[1]}], 0.0, dtype=tl.float32)  # {inner.matmul} at this tile",
        f"for {kvar} in tl.range(0, {k}, {step}):",
        *("    " + line for line in body),
    ]
    return product_value(writer, inner.matmul, acc, root)


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


def varies_with(expr: Expr, dim: int) -> bool:
    """Whether `expr` varies with index variable `dim`."""

    def has(atom) -> bool:
        if isinstance(atom, Var):
            return atom.dim == dim
        inner = getattr(atom, "expr", None)
        return inner is not None and any(has(a) for a, _ in inner.terms)

    return any(has(atom) for atom, _ in expr.terms)
