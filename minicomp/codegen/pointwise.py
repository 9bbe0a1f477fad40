"""Kernels of kind "pointwise": one flat iteration space, `BLOCK_SIZE` elements a program.

The space is the stored value's shape with its dims in memory order (so the
store is contiguous); `offsets` runs over it and each iteration variable
`x{k}` is cut out of `offsets` (indexing.py). Template: pointwise.py.j2.

`write` writes a kernel twice when its cat/slice comparisons cut one dim into
a few equal parts: the second time that dim is walked part by part, so each
part's comparisons are decided in the text (codegen/split.py).

A dim walked in two interleaved parts (elements 2i and 2i + 1) reads and
writes pairs: where both elements of a pair are loaded under the bounds mask
alone, and the pair's address is twice the flat index of the space (the
buffer laid out like the walk), one contiguous load of 2 * BLOCK_SIZE
elements (`pairs`) is split in two; the parts' stores are joined likewise.
GPT-J's rotary walked element by element (its pairs under parity masks)
took 2.6x the SASS instructions an element of this walk (sm_90, 5.5 global
loads an element against 1: benchmarks/experiments/pair_loads.py).
"""

from __future__ import annotations

import torch

from minicomp.codegen import plane_order
from minicomp.codegen import split as splitting
from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, IterationSpace, const, size
from minicomp.lowering.layout import extent
from minicomp.plan.fusion import Kernel, Plan


def iteration_order(stride: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Dims from outermost to innermost in memory: walking them in this order
    makes the store (and loads laid out like it) contiguous."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d] if shape[d] > 1 else 0, d))


def write(plan: Plan, kernel: Kernel) -> KernelSource:
    """The kernel's source, walking a dim in parts where its cat/slice boundaries allow."""
    writer, source = _surveyed(plan, kernel)
    split = splitting.choose(writer.space, writer.boundaries, writer.periods)
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
    reserved = ("offsets", "mask", "pid", "pairs", "pair_mask", "blocks", "plane", "start")

    def __init__(self, plan: Plan, kernel: Kernel, split: splitting.Split | None = None, survey: dict | None = None):
        first = plan.graph[kernel.stores[0]].meta
        self.order = iteration_order(plan.strides[kernel.stores[0]], first.shape)
        self.full_shape = [first.shape[d] for d in self.order]
        self.split = split
        shape = list(self.full_shape)
        if split is not None:
            shape[split.dim] = split.size
        super().__init__(plan, kernel, IterationSpace(shape, base="offsets"), survey)
        self.paired: dict[tuple[str, Expr], tuple[ops.Value, ops.Value]] = {}  # (buffer, pair address) -> halves
        self.uses_pairs = False  # a paired load or a joined store: the kernel defines `pairs`

    def root_index(self, part: int = 0) -> tuple[Expr, ...]:
        """The index of a stored value: logical dim order[k] walks variable x_k
        (plus part * m on the split dim)."""
        index = [None] * len(self.order)
        for k, d in enumerate(self.order):
            index[d] = self.space.var(k)
            if self.split is not None and k == self.split.dim:
                index[d] = self.split.position(index[d], part)
        return tuple(index)

    # -- pairs (an interleaved split in two) ------------------------------------
    def pair_start(self, offset: Expr) -> int | None:
        """c when `offset` is 2 * (the flat index of the space) + c + r, r the part (0 or 1): the
        two parts' elements then lie side by side, pair k at c + 2k. Else None."""
        if self.split is None or not self.split.interleaved or self.split.parts != 2:
            return None
        flat = Expr()
        for k, pitch in enumerate(self.space.pitch):
            flat = flat + self.space.var(k) * pitch
        start = offset - flat * 2
        return start.const - start.const % 2 if start.is_const else None

    def load(self, name: str, index, mask) -> ops.Value:
        """An element of a pair whose both elements this kernel loads plainly: half of one load."""
        offset = self.offset_of(name, index)
        start = None if mask or offset.is_const else self.pair_start(offset)
        even = offset - offset.const % 2 if start is not None else None
        if start is None or not self.survey or not all(() in self.survey.get((name, even + r), ()) for r in (0, 1)):
            return super().load(name, index, mask)
        self.load_offsets.setdefault(name, set()).add(offset)
        if (name, even) not in self.paired:
            if name not in self.pointers:
                self.pointers[name] = f"{name}_ptr"
            dtype = self.graph[name].meta.dtype
            code = f"tl.load({self.pointers[name]} + {_pairs_at(start)}, mask=pair_mask, other=0)"
            if dtype in dtypes.LOW_PRECISION:
                code, dtype = code + ".to(tl.float32)", torch.float32
            halves = tuple(ops.Value(self.fresh(name), dtype) for _ in range(2))
            split = f"tl.split(tl.reshape({code}, [BLOCK_SIZE, 2]))"
            self.plain_loads.append(f"{halves[0].code}, {halves[1].code} = {split}")
            self.paired[(name, even)] = halves
            self.uses_pairs = True
        return self.paired[(name, even)][offset.const % 2]

    def write(self) -> KernelSource:
        store_offsets: dict[str, list[Expr]] = {}
        codes: dict[str, list[str]] = {}
        outs = out_pointers(self.kernel.stores)
        for part in range(self.split.parts if self.split else 1):
            root = self.root_index(part)
            if self.split is not None:
                self.lines.append(f"# part {part} of {self.split.parts}")  # no size in it: see codegen/families.py
            for name in outs:
                offset = Expr()
                for e, stride in zip(root, self.plan.strides[name]):
                    offset = offset + e * stride
                store_offsets.setdefault(name, []).append(offset)
                codes.setdefault(name, []).append(ops.cast(self.value(name, root), self.graph[name].meta.dtype))
        by_output = [self._stores(out, store_offsets[name], codes[name]) for name, out in outs.items()]
        parts = len(codes[self.kernel.stores[0]])
        stores = []
        for part in range(parts):  # part by part, as the values were written
            for lines in by_output:
                if len(lines) == parts:
                    stores.append(lines[part])
                elif part == parts - 1:  # the parts' values joined: one store
                    stores.extend(lines)
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        wide = needs_wide_index(self.graph, self.space.numel, args)
        defs = [f"x{v.dim} = {self.space.definition(v)}" for v in sorted(self.vars, key=lambda v: v.dim)]
        order = plane_order.choose(self.space.shape, self.load_offsets, self._bytes(args))
        if order is not None:  # the template leaves `offsets` and `mask` to these lines
            inner = self.space.numel // order.planes
            defs = plane_order.prologue(order, inner, wide, self.uses_pairs) + defs
        elif self.uses_pairs:  # element k of the walk's pairs: offsets 2*pid*BLOCK_SIZE + k
            start = "pid.to(tl.int64)" if wide else "pid"
            defs += [
                f"pairs = {start} * (2 * BLOCK_SIZE) + tl.arange(0, 2 * BLOCK_SIZE)",
                "pair_mask = pairs < 2 * n_elements",
            ]
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
        if order is not None:
            header.append(f"  {order.describe()}")
        return KernelSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.space.numel,
            header=header,
            body=defs + self.plain_loads + self.lines + stores,
            wide_index=wide,
            parts=self.split.parts if self.split else 1,
            planes=(order.planes, order.group) if order else (),
            aligned={}
            if self.split
            else {
                name: tuple(b for b, loaded in self.load_offsets.items() if loaded == set(store_offsets[name]))
                for name in self.kernel.stores
            },
        )

    def _bytes(self, buffers: list[str]) -> dict[str, int]:
        """Bytes each buffer the kernel reads or writes spans in memory (an expanded input's
        repeats counted once)."""
        spans = {}
        for name in buffers:
            meta = self.graph[name].meta
            spans[name] = extent(meta.shape, self.plan.strides.get(name, meta.stride)) * meta.dtype.itemsize
        return spans

    def _stores(self, out: str, offsets: list[Expr], codes: list[str]) -> list[str]:
        """The stores of one output, a value a part: the two parts' values joined into one store
        where they are the elements of pairs (`pair_start`)."""
        starts = {self.pair_start(o) for o in offsets}
        if len(offsets) == 2 and len(starts) == 1 and None not in starts and offsets[1] - offsets[0] == const(1):
            joined = f"tl.reshape(tl.join({codes[0]}, {codes[1]}), [2 * BLOCK_SIZE])"
            self.uses_pairs = True
            return [f"tl.store({out} + {_pairs_at(starts.pop())}, {joined}, mask=pair_mask)"]
        stores = []
        for offset, code in zip(offsets, codes):
            address = "offsets" if offset.is_const else paren(self.address(offset))  # const: numel 1
            stores.append(f"tl.store({out} + {address}, {code}, mask=mask)")
        return stores


def _pairs_at(start: int) -> str:
    """The addresses of pairs beginning `start` elements into a buffer."""
    return "pairs" if start == 0 else f"(pairs + {size(start)})" if start > 0 else f"(pairs - {size(-start)})"
