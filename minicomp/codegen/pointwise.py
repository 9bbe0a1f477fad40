"""Kernels of kind "pointwise": one flat iteration space, `BLOCK_SIZE` elements a program.

The space is the stored value's shape with its dims in memory order (so the
store is contiguous); `offsets` runs over it and each iteration variable
`x{k}` is cut out of `offsets` (indexing.py). Template: pointwise.py.j2.

`write` writes a kernel twice when its cat/slice comparisons cut one dim into
a few equal parts: the second time that dim is walked part by part, so each
part's comparisons are decided in the text (codegen/split.py).
"""

from __future__ import annotations

from minicomp import ops
from minicomp.codegen import split as splitting
from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.fusion import Kernel, Plan
from minicomp.indexing import Expr, IterationSpace, const


def iteration_order(stride: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Dims from outermost to innermost in memory: walking them in this order
    makes the store (and loads laid out like it) contiguous."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d] if shape[d] > 1 else 0, d))


def write(plan: Plan, kernel: Kernel) -> KernelSource:
    """The kernel's source, walking a dim in parts where its cat/slice boundaries allow."""
    writer, source = _surveyed(plan, kernel)
    split = splitting.choose(writer.space, writer.boundaries)
    return source if split is None else _surveyed(plan, kernel, split)[1]


def _surveyed(plan: Plan, kernel: Kernel, split: splitting.Split | None = None):
    """(writer, source) written twice: the first pass surveys which addresses are loaded under
    which conditions, so the second loads an address once where it is read under complementary
    conditions (KernelWriter.merged_mask)."""
    survey = PointwiseWriter(plan, kernel, split)
    survey.write()
    writer = PointwiseWriter(plan, kernel, split, survey.requests)
    return writer, writer.write()


class PointwiseWriter(KernelWriter):
    tile = "[BLOCK_SIZE]"
    root_mask = "mask"
    reserved = ("offsets", "mask", "pid")

    def __init__(self, plan: Plan, kernel: Kernel, split: splitting.Split | None = None, survey: dict | None = None):
        first = plan.graph[kernel.stores[0]].meta
        self.order = iteration_order(plan.strides[kernel.stores[0]], first.shape)
        self.full_shape = [first.shape[d] for d in self.order]
        self.split = split
        shape = list(self.full_shape)
        if split is not None:
            shape[split.dim] = split.size
        super().__init__(plan, kernel, IterationSpace(shape, base="offsets"), survey)

    def root_index(self, part: int = 0) -> tuple[Expr, ...]:
        """The index of a stored value: logical dim order[k] walks variable x_k
        (plus part * m on the split dim)."""
        index = [None] * len(self.order)
        for k, d in enumerate(self.order):
            index[d] = self.space.var(k)
            if self.split is not None and k == self.split.dim:
                index[d] = index[d] + const(part * self.split.size)
        return tuple(index)

    def write(self) -> KernelSource:
        stores = []
        store_offsets: dict[str, set[Expr]] = {}
        outs = out_pointers(self.kernel.stores)
        for part in range(self.split.parts if self.split else 1):
            root = self.root_index(part)
            if self.split is not None:
                self.lines.append(f"# part {part} of {self.split.parts}")  # no size in it: see codegen/families.py
            for name, out in outs.items():
                meta = self.graph[name].meta
                value = self.value(name, root)
                offset = Expr()
                for e, stride in zip(root, self.plan.strides[name]):
                    offset = offset + e * stride
                code = ops.cast(value, meta.dtype)
                store_offsets.setdefault(name, set()).add(offset)
                address = "offsets" if offset.is_const else paren(self.address(offset))  # const: numel 1
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
            header.append(
                f"  {self.split.describe(self.full_shape[self.split.dim])}: "
                f"each part's cat/slice choices are decided in its own lines"
            )
        return KernelSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.space.numel,
            header=header,
            body=defs + self.plain_loads + self.lines + stores,
            wide_index=needs_wide_index(self.graph, self.space.numel, args),
            parts=self.split.parts if self.split else 1,
            aligned={}
            if self.split
            else {
                name: tuple(b for b, loaded in self.load_offsets.items() if loaded == store_offsets[name])
                for name in self.kernel.stores
            },
        )
