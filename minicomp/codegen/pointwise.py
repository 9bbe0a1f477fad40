"""Kernels of kind "pointwise": one flat iteration space, `BLOCK_SIZE` elements a program.

The space is the stored value's shape with its dims in memory order (so the
store is contiguous); `offsets` runs over it and each iteration variable
`x{k}` is cut out of `offsets` (indexing.py). Template: pointwise.py.j2.

`write` writes a kernel twice when its cat/slice comparisons cut one dim into
a few equal parts: the second time that dim is walked part by part, so each
part's comparisons are decided in the text (codegen/parts.py).

A dim walked in two interleaved parts (elements 2i and 2i + 1) reads and
writes pairs: where both elements of a pair are loaded under the bounds mask
alone, and the pair's address is twice the flat index of the space (the
buffer laid out like the walk), one contiguous load of 2 * BLOCK_SIZE
elements (`pairs`) is cut in two with `tl.split`; the parts' stores are joined
likewise. Walked element by element, the pairs would be loaded under parity
masks (benchmarks/experiments/pair_loads.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from minicomp.codegen import parts as walking
from minicomp.codegen import plane_order
from minicomp.codegen.kernel import KernelSource, KernelWriter, needs_wide_index, out_pointers, paren
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, IterationSpace, Var, const, size
from minicomp.lowering.layout import extent
from minicomp.plan.fusion import Kernel, Plan
from minicomp.runtime.launch_spec import PointwiseLaunch


@dataclass(kw_only=True)
class PointwiseSource(KernelSource):
    """A pointwise kernel's text and its launch fields."""

    kind: ClassVar[str] = "pointwise"
    template: ClassVar[str] = "pointwise.py.j2"
    numel_param: ClassVar[str] = "n_elements"

    parts: int = 1  # elements written per offset (codegen/parts.py)
    planes: int = 0  # planes walked `group` side by side (codegen/plane_order.py), else 0
    group: int = 0
    # store -> buffers read at its own address and nowhere else (a kernel walked in parts: none, as
    # its parts read each other's elements); codegen/reuse.py may write the store over one of them
    aligned: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def launch_spec(self) -> PointwiseLaunch:
        return PointwiseLaunch(numel=self.numel, parts=self.parts, planes=self.planes, group=self.group)


def iteration_order(stride: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Dims from outermost to innermost in memory: walking them in this order
    makes the store (and loads laid out like it) contiguous."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d] if shape[d] > 1 else 0, d))


def write(plan: Plan, kernel: Kernel) -> PointwiseSource:
    """The kernel's source, walking a dim in parts where its cat/slice boundaries allow."""
    writer, source = _surveyed(plan, kernel)
    parts = walking.choose(writer.space, writer.boundaries, writer.periods)
    return source if parts is None else _surveyed(plan, kernel, parts)[1]


def _surveyed(plan: Plan, kernel: Kernel, parts: walking.Parts | None = None):
    """(writer, source) written twice where it may change: the first pass surveys which addresses
    are loaded under which conditions, so the second loads an address once where it is read under
    complementary conditions (KernelWriter.merged_mask) or as half of a pair (`load`). Where no
    address was loaded under two sets of conditions and no dim is walked in two interleaved parts,
    the second pass would write the first one's text: the first is the source."""
    survey = PointwiseWriter(plan, kernel, parts)
    first = survey.write()
    paired = parts is not None and parts.interleaved and parts.count == 2
    if not paired and all(len(conditions) < 2 for conditions in survey.requests.values()):
        return survey, first
    writer = PointwiseWriter(plan, kernel, parts, survey.requests)
    return writer, writer.write()


class PointwiseWriter(KernelWriter):
    tile = "[BLOCK_SIZE]"
    root_mask = "mask"
    reserved = ("offsets", "mask", "pid", "pairs", "pair_mask", "blocks", "plane", "start")

    def __init__(self, plan: Plan, kernel: Kernel, parts: walking.Parts | None = None, survey: dict | None = None):
        first = plan.graph[kernel.stores[0]].meta
        self.order = iteration_order(plan.strides[kernel.stores[0]], first.shape)
        self.full_shape = [first.shape[d] for d in self.order]
        self.parts = parts  # the dim walked in parts, if one is
        shape = list(self.full_shape)
        if parts is not None:
            shape[parts.dim] = parts.size
        super().__init__(plan, kernel, IterationSpace(shape, base="offsets"), survey)
        self.paired: dict[tuple[str, Expr], tuple[ops.Value, ops.Value]] = {}  # (buffer, pair address) -> halves
        self.uses_pairs = False  # a paired load or a joined store: the kernel defines `pairs`

    def root_index(self, part: int = 0) -> tuple[Expr, ...]:
        """The index of a stored value: logical dim order[k] walks variable x_k
        (plus part * m on the dim walked in parts)."""
        index = [None] * len(self.order)
        for k, d in enumerate(self.order):
            index[d] = self.space.var(k)
            if self.parts is not None and k == self.parts.dim:
                index[d] = self.parts.position(index[d], part)
        return tuple(index)

    # -- pairs (a dim walked in two interleaved parts) ----------------------------
    def pair_start(self, offset: Expr) -> int | None:
        """c when `offset` is 2 * (the flat index of the space) + c + r, r the part (0 or 1): the
        two parts' elements then lie side by side, pair k at c + 2k. Else None."""
        if self.parts is None or not self.parts.interleaved or self.parts.count != 2:
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
            halved = f"tl.split(tl.reshape({code}, [BLOCK_SIZE, 2]))"
            self.plain_loads.append(f"{halves[0].code}, {halves[1].code} = {halved}")
            self.paired[(name, even)] = halves
            self.uses_pairs = True
        return self.paired[(name, even)][offset.const % 2]

    def write(self) -> PointwiseSource:
        outs = out_pointers(self.kernel.stores)
        stores, store_offsets = self._store_lines(outs)
        params = list(self.pointers.values()) + list(outs.values())
        args = list(self.pointers) + list(outs)
        wide = needs_wide_index(self.plan, self.space.numel, args)
        order = plane_order.choose(self.space.shape, self.load_offsets, self._bytes(args))
        return PointwiseSource(
            kernel=self.kernel,
            name=self.kernel.name,
            params=params,
            args=args,
            numel=self.space.numel,
            header=self._header(order),
            body=self._definitions(order, wide) + self.plain_loads + self.lines + stores,
            wide_index=wide,
            parts=self.parts.count if self.parts else 1,
            planes=order.planes if order else 0,
            group=order.group if order else 0,
            aligned={}
            if self.parts
            else {
                name: tuple(b for b, loaded in self.load_offsets.items() if loaded == set(store_offsets[name]))
                for name in self.kernel.stores
            },
        )

    def _store_lines(self, outs: dict[str, str]) -> tuple[list[str], dict[str, list[Expr]]]:
        """(the store lines, part by part as the values were written; each output's store offsets)."""
        store_offsets: dict[str, list[Expr]] = {}
        codes: dict[str, list[str]] = {}
        apart: dict[str, frozenset[int]] = {}  # its last dim's variables, for a row-bounded value (Plan.row_bounded)
        for part in range(self.parts.count if self.parts else 1):
            root = self.root_index(part)
            if self.parts is not None:
                self.lines.append(f"# part {part} of {self.parts.count}")  # no size in it: see codegen/families.py
            for name in outs:
                offset = Expr()
                for e, stride in zip(root, self.plan.strides[name]):
                    offset = offset + e * stride
                store_offsets.setdefault(name, []).append(offset)
                codes.setdefault(name, []).append(ops.cast(self.value(name, root), self.graph[name].meta.dtype))
                if name in self.plan.row_bounded and root:
                    apart[name] = frozenset(a.dim for a, _ in root[-1].terms if isinstance(a, Var))
        by_output = [
            self._stores(out, store_offsets[name], codes[name], apart.get(name, frozenset()))
            for name, out in outs.items()
        ]
        count = len(codes[self.kernel.stores[0]])
        stores = []
        for part in range(count):
            for lines in by_output:
                if len(lines) == count:
                    stores.append(lines[part])
                elif part == count - 1:  # the parts' values joined: one store
                    stores.extend(lines)
        return stores, store_offsets

    def _definitions(self, order: plane_order.PlaneOrder | None, wide: bool) -> list[str]:
        """The lines that define the iteration variables; in a plane order first `offsets` and
        `mask` (else the template defines them), and `pairs` and `pair_mask` where pairs are
        loaded or stored."""
        defs = [f"x{v.dim} = {self.space.definition(v)}" for v in sorted(self.vars, key=lambda v: v.dim)]
        if order is not None:
            return plane_order.prologue(order, self.space.numel // order.planes, wide, self.uses_pairs) + defs
        if not self.uses_pairs:
            return defs
        start = "pid.to(tl.int64)" if wide else "pid"  # element k of the walk's pairs: offsets 2*pid*BLOCK_SIZE + k
        return defs + [
            f"pairs = {start} * (2 * BLOCK_SIZE) + tl.arange(0, 2 * BLOCK_SIZE)",
            "pair_mask = pairs < 2 * n_elements",
        ]

    def _header(self, order: plane_order.PlaneOrder | None) -> list[str]:
        space = " x ".join(map(str, self.full_shape)) or "scalar"
        header = [
            f"kernel {self.kernel.index}: {', '.join(self.kernel.nodes) or 'copy'}",
            f"  aten ops: {', '.join(dict.fromkeys(self.kernel.op_names)) or '-'}",
            f"  iteration space: [{space}] (dims {self.order} of {list(self.kernel.shape)})",
            f"  reads {', '.join(self.kernel.loads) or '-'}; writes {', '.join(self.kernel.stores)}",
        ]
        if self.parts is not None:
            header.append(
                f"  {self.parts.describe(self.full_shape[self.parts.dim])}: "
                f"each part's cat/slice choices are decided in its own lines"
            )
        if order is not None:
            header.append(f"  {order.describe()}")
        return header

    def _bytes(self, buffers: list[str]) -> dict[str, int]:
        """Bytes each buffer the kernel reads or writes spans in memory (an expanded input's
        repeats counted once)."""
        spans = {}
        for name in buffers:
            meta = self.graph[name].meta
            spans[name] = extent(meta.shape, self.plan.strides.get(name, meta.stride)) * meta.dtype.itemsize
        return spans

    def _stores(self, out: str, offsets: list[Expr], codes: list[str], apart: frozenset[int]) -> list[str]:
        """The stores of one output, a value a part: the two parts' values joined into one store
        where they are the elements of pairs (`pair_start`); the variables `apart` join no run of
        the index (IterationSpace.collapse)."""
        starts = {self.pair_start(o) for o in offsets}
        paired = len(offsets) == 2 and len(starts) == 1 and None not in starts
        if not apart and paired and offsets[1] - offsets[0] == const(1):
            joined = f"tl.reshape(tl.join({codes[0]}, {codes[1]}), [2 * BLOCK_SIZE])"
            self.uses_pairs = True
            return [f"tl.store({out} + {_pairs_at(starts.pop())}, {joined}, mask=pair_mask)"]
        stores = []
        for offset, code in zip(offsets, codes):
            address = "offsets" if offset.is_const else paren(self.address(offset, apart))  # const: numel 1
            stores.append(f"tl.store({out} + {address}, {code}, mask=mask)")
        return stores


def _pairs_at(start: int) -> str:
    """The addresses of pairs beginning `start` elements into a buffer."""
    return "pairs" if start == 0 else f"(pairs + {size(start)})" if start > 0 else f"(pairs - {size(-start)})"
