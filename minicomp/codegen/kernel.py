"""One fused kernel -> Triton source.

The writer evaluates each stored node at the kernel's root index and recurses
through the lowering table: a pointwise op becomes one line named after its FX
node, a view only rewrites the index it passes down, and a node that lives in
memory becomes a masked `tl.load`. Evaluations are memoized on (node, index,
mask), so a value used twice at the same index is computed once, and one used
at a shifted index (rotate_half) is loaded again at that index.

`write_kernel` writes a kernel twice when its cat/slice comparisons cut one
dim into a few equal parts: the second time that dim is walked part by part,
so each part's comparisons are decided in the text (codegen/split.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minicomp import dtypes, ops
from minicomp.codegen import split as splitting
from minicomp.fusion import Kernel, Plan, output_strides
from minicomp.indexing import Expr, IterationSpace, Var, const, render_flat

INT32_LIMIT = 2**31 - 1


@dataclass
class KernelSource:
    kernel: Kernel
    name: str
    params: list[str]       # pointer parameter names, in launch order
    args: list[str]         # the buffers passed for them, in the same order
    numel: int
    header: list[str]
    body: list[str]
    wide_index: bool        # offsets need int64
    sizes: list[str] = field(default_factory=list)         # runtime size parameters (codegen/families.py)
    size_values: list[int] = field(default_factory=list)   # and this signature's values for them
    parts: int = 1          # elements written per offset (codegen/split.py)


def iteration_order(stride: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Dims from outermost to innermost in memory: walking them in this order
    makes the store (and loads laid out like it) contiguous."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d] if shape[d] > 1 else 0, d))


def write_kernel(plan: Plan, kernel: Kernel) -> KernelSource:
    """The kernel's source, walking a dim in parts where its cat/slice boundaries allow."""
    writer = KernelWriter(plan, kernel)
    source = writer.write()
    split = splitting.choose(writer.space, writer.boundaries)
    return source if split is None else KernelWriter(plan, kernel, split).write()


class KernelWriter:
    def __init__(self, plan: Plan, kernel: Kernel, split: splitting.Split | None = None):
        self.plan, self.graph, self.kernel = plan, plan.graph, kernel
        first = self.graph[kernel.stores[0]].meta
        self.order = iteration_order(output_strides(first), first.shape)
        self.full_shape = [first.shape[d] for d in self.order]
        self.split = split
        shape = list(self.full_shape)
        if split is not None:
            shape[split.dim] = split.size
        self.space = IterationSpace(shape)
        self.boundaries: dict[int, set[int]] = {}    # space dim -> where a comparison changes truth
        self.plain_loads: list[str] = []   # loads under no condition but `mask`: emitted first
        self.lines: list[str] = []         # everything else, in evaluation order
        self.memo: dict[tuple, ops.Value] = {}        # (node, index, mask) -> its value
        self.emitted: dict[tuple, ops.Value] = {}     # (code, dtype) -> the line that computes it
        self.taken: set[str] = set(self.graph.order) | {"offsets", "mask", "pid"}
        self.used: set[str] = set()
        self.pointers: dict[str, str] = {}   # buffer name -> pointer parameter
        self.vars: set[Var] = set()

    # -- names --------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """`hint` itself the first time a node is computed, `hint_1`, ... after."""
        name, n = hint, 0
        while name in self.used or (name in self.taken and name != hint):
            n += 1
            name = f"{hint}_{n}"
        self.used.add(name)
        return name

    def atom_name(self, atom) -> str:
        if isinstance(atom, Var):
            self.vars.add(atom)
            return f"x{atom.dim}"
        return render_flat(atom)

    def index_text(self, expr: Expr) -> str:
        return expr.render(self.atom_name)

    def address(self, expr: Expr) -> str:
        return self.space.collapse(expr).render(self.atom_name)

    @staticmethod
    def mask_text(mask: tuple[str, ...]) -> str:
        return " & ".join(("mask",) + mask)

    def compare(self, expr: Expr, relation: str, bound: int) -> str | bool:
        """`expr <relation> bound` (>=, < or ==): decided here when the range of `expr` lies on
        one side, else its source. Where the truth changes at one value of a variable whatever
        the rest of `expr` is (`3*x0 + x1 >= 3` with x1 < 3: at x0 = 1), that value is recorded
        as a boundary of the variable's range (codegen/split.py)."""
        lo, hi = expr.bounds
        if relation == ">=":
            decided = True if lo >= bound else False if hi < bound else None
        elif relation == "<":
            decided = True if hi < bound else False if lo >= bound else None
        else:
            decided = True if lo == hi == bound else False if not lo <= bound <= hi else None
        if decided is not None:
            return decided
        for atom, coeff in expr.terms:
            if isinstance(atom, Var):
                rest_lo, rest_hi = (expr - Expr.of(atom) * coeff).bounds
                cut = splitting.boundary(coeff, rest_lo, relation, bound)
                if cut == splitting.boundary(coeff, rest_hi, relation, bound):
                    self.boundaries.setdefault(atom.dim, set()).update(cut)
        return f"({self.index_text(expr)} {relation} {bound})"

    # -- values -------------------------------------------------------------
    def root_index(self, part: int = 0) -> tuple[Expr, ...]:
        """The index of a stored value: logical dim order[k] walks variable x_k
        (plus part * m on the split dim)."""
        index = [None] * len(self.order)
        for k, d in enumerate(self.order):
            index[d] = self.space.var(k)
            if self.split is not None and k == self.split.dim:
                index[d] = index[d] + const(part * self.split.size)
        return tuple(index)

    def temp(self, code: str, dtype: torch.dtype, hint: str, comment: str = "", plain_load: bool = False
             ) -> ops.Value:
        """A line `name = code`; the same code again (same dtype) reuses the first line's name.
        Every line is pure (stores come last), so this is common-subexpression elimination: two
        slices of one gradient test `x3 < 64` once, and a load behind that test is shared too."""
        key = (code, dtype)
        if key not in self.emitted:
            name = self.fresh(hint)
            line = f"{name} = {code}" + (f"  # {comment}" if comment else "")
            (self.plain_loads if plain_load else self.lines).append(line)
            self.emitted[key] = ops.Value(name, dtype)
        return self.emitted[key]

    def value(self, name: str, index: tuple[Expr, ...], mask: tuple[str, ...] = ()) -> ops.Value:
        key = (name, index, mask)
        if key not in self.memo:
            self.memo[key] = self._evaluate(name, index, mask)
        return self.memo[key]

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        node = self.graph[name]
        if self.plan.is_loadable(name, self.kernel.stage):
            return self.load(name, index, mask)
        op_name = node.op_name
        op = ops.Op(node, self.graph, self, index, mask)
        if op_name in ops.VIEWS:
            source, source_index = ops.VIEWS[op_name](op, index)
            return self.value(source, source_index, mask)
        rule = ops.INDEXED.get(op_name) or ops.POINTWISE[op_name]
        code = rule(op)
        if code in self.used:  # the rule passed a value through (a decided cat or scatter): no alias line
            return ops.Value(code, op.compute)
        return self.temp(code, op.compute, name, _provenance(node))

    def load(self, name: str, index, mask) -> ops.Value:
        meta = self.graph[name].meta
        if name not in self.pointers:
            self.pointers[name] = f"{name}_ptr"
        offset = Expr()
        for e, stride, size in zip(index, meta.stride, meta.shape):
            if size > 1:
                offset = offset + e * stride
        if offset.is_const:  # one element for every lane (0-d or fully broadcast): load once, spread
            code = f"tl.broadcast_to(tl.load({self.pointers[name]} + {offset.const}), [BLOCK_SIZE])"
        else:
            code = f"tl.load({self.pointers[name]} + {self._paren(self.address(offset))}, mask={self.mask_text(mask)}, other=0)"
        dtype = meta.dtype
        if dtype in dtypes.LOW_PRECISION:
            code += ".to(tl.float32)"
            dtype = torch.float32
        # A load behind no condition but `mask` depends on nothing but the index: it goes to the top,
        # so each row's own elements are requested before the shifted, conditional reads of the same
        # rows (RoPE's rotate_half, slice gradients). Measured on the RoPE backward, H200 float32:
        # 1.049x -> 1.028x the memory floor (benchmarks/experiments/rope_backward_variants.py).
        return self.temp(code, dtype, name, plain_load=not mask)

    @staticmethod
    def _paren(text: str) -> str:
        return text if text.isidentifier() or text.isdigit() else f"({text})"

    # -- the whole kernel ---------------------------------------------------
    def write(self) -> KernelSource:
        stores = []
        outs = {name: "out_ptr" if len(self.kernel.stores) == 1 else f"out{k}_ptr"
                for k, name in enumerate(self.kernel.stores)}
        for part in range(self.split.parts if self.split else 1):
            root = self.root_index(part)
            if self.split is not None:
                self.lines.append(f"# part {part} of {self.split.parts}")  # no size in it: see codegen/families.py
            for name, out in outs.items():
                meta = self.graph[name].meta
                value = self.value(name, root)
                offset = Expr()
                for e, stride in zip(root, output_strides(meta)):
                    offset = offset + e * stride
                code = ops.cast(value, meta.dtype)
                address = "offsets" if offset.is_const else self._paren(self.address(offset))  # const: numel 1
                stores.append(f"tl.store({out} + {address}, {code}, mask=mask)")
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        defs = [f"x{v.dim} = {self.space.definition(v)}" for v in sorted(self.vars, key=lambda v: v.dim)]
        space = " x ".join(map(str, self.full_shape)) or "scalar"
        header = [
            f"kernel {self.kernel.index}: {', '.join(self.kernel.nodes) or 'copy'}",
            f"  aten ops: {', '.join(dict.fromkeys(self.kernel.op_names)) or '-'}",
            f"  iteration space: [{space}] (dims {self.order} of {list(self.kernel.shape)})",
            f"  reads {', '.join(self.kernel.loads) or '-'}; writes {', '.join(self.kernel.stores)}",
        ]
        if self.split is not None:
            header.append(f"  {self.split.describe(self.full_shape[self.split.dim])}: "
                          f"each part's cat/slice choices are decided in its own lines")
        return KernelSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.space.numel,
            header=header,
            body=defs + self.plain_loads + self.lines + stores,
            wide_index=self.space.numel > INT32_LIMIT or _max_offset(self.graph, args) > INT32_LIMIT,
            parts=self.split.parts if self.split else 1,
        )


def _provenance(node) -> str:
    return f"aten.{node.target._opname}.{node.target._overloadname}"


def _max_offset(graph, names) -> int:
    """The largest element offset any buffer of the kernel is addressed at."""
    worst = 0
    for name in names:
        meta = graph[name].meta
        worst = max(worst, sum((s - 1) * st for s, st in zip(meta.shape, meta.stride) if s > 0))
    return worst
