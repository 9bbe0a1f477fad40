"""What a plan is made of: kernels of each kind, extern calls, refusals, and the `Plan` itself.

A kernel kind is a class with only its own fields; each describes itself for the plan's text.
Codegen has one writer and one template per kernel class (codegen/module.py `WRITERS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minicomp.ir import Graph
from minicomp.lowering.ops import NodeKind
from minicomp.plan.reduction_space import ReductionSpace


@dataclass
class Kernel:
    """What every kernel kind has: its place in the plan, its iteration space, what it computes,
    reads and writes."""

    index: int
    stage: int
    shape: tuple[int, ...]  # the iteration space (a reduction kernel's: the reduced value's shape)
    stores: list[str]  # nodes this kernel writes
    nodes: list[str] = field(default_factory=list)  # pointwise/view/reduction nodes it computes
    loads: list[str] = field(default_factory=list)  # buffers it reads
    op_names: list[str] = field(default_factory=list)  # the op of each of `nodes`

    @property
    def name(self) -> str:
        """mc_fused_<ops it computes, first six>_<index>: names say what is fused."""
        words: list[str] = []
        for op in self.op_names:
            if op not in words:
                words.append(op)
        text = "_".join(w.strip("_") for w in words[:6]) or "copy"
        return f"mc_fused_{text}_{self.index}"

    def headline(self) -> str:
        """The kernel's first line in the plan's text: name, stage and what it walks."""
        raise NotImplementedError(f"{type(self).__name__} does not describe itself")

    def describe(self) -> list[str]:
        """The kernel's lines in the plan's text."""
        return [
            self.headline(),
            f"    computes {self.nodes}",
            f"    reads {self.loads}  writes {self.stores}",
        ]


@dataclass
class PointwiseKernel(Kernel):
    """One flat iteration space: every value it writes has the kernel's shape."""

    def headline(self) -> str:
        return f"kernel {self.name}  stage {self.stage}  space {list(self.shape)}"


@dataclass
class ReductionKernel(Kernel):
    """The reductions of one space (`ReductionSpace`) and stage, and what of the stage reads them
    at the kernel's index: rows of `shape` reduced over the `reduced` dims."""

    reduced: tuple[int, ...] = ()  # the reduced dims of `shape`
    looped: bool = False  # walks its rows RBLOCK at a time (else holds them whole)
    rblock: int = 0  # RBLOCK: the row elements a program holds at once
    outer: bool = False  # its rows, not its reduced dims, are contiguous in memory
    split: tuple[str, int] | None = None  # (reduction, K): this kernel computes its K split-K partial results
    group: int = 0  # rows a program takes in turn, when it computes row-group partials (`grouped`)
    grouped: list[str] = field(default_factory=list)  # row-group partials: one row of each a program

    @property
    def form(self) -> str:
        """How the kernel walks its rows, as the plan and the kernel header say it."""
        text = f"looped, {self.rblock} a step" if self.looped else f"persistent, RBLOCK {self.rblock}"
        if self.outer:
            text += ", rows contiguous"
        if self.split:
            text = f"split {self.split[1]} ways for {self.split[0]}, " + text
        if self.group:
            text += f"; {self.group} rows a program, partial column results of {', '.join(self.grouped)}"
        return text

    def headline(self) -> str:
        return (
            f"kernel {self.name}  stage {self.stage}  reduction over {list(self.shape)} "
            f"dims {list(self.reduced)} ({self.form})"
        )


def _op_first(prefix: str, op_names: list[str], index: int) -> str:
    """<prefix>_<the kernel's own op (the last of its nodes), then the ops it computes>_<index>."""
    ops = op_names[-1:] + op_names[:-1]
    words = [op.strip("_") for op in dict.fromkeys(ops)]
    return f"{prefix}_{'_'.join(words[:6])}_{index}"


@dataclass
class ScatterKernel(Kernel):
    """One scatter-accumulate node (`stores[0]`: index_put with accumulate, scatter_add;
    lowering/ops/scatters.py): walks its values' space `shape`, computing each value (its
    producers inlined) and adding it atomically into the output at the element its index tensors
    name. The output starts as `fill` (its `self` is a constant `full`: the wrapper allocates it
    filled) or as a copy of `base`, which the kernel's stage reads from memory (plan/scatter.py)."""

    fill: float | int | bool | None = None
    base: str | None = None

    @property
    def name(self) -> str:
        """mc_scatter_<its op, then the ops it computes, five>_<index>."""
        return _op_first("mc_scatter", self.op_names, self.index)

    def headline(self) -> str:
        start = f"starting as {self.base}" if self.base else f"filled with {self.fill!r}"
        return f"kernel {self.name}  stage {self.stage}  scatter over {list(self.shape)} into a buffer {start}"


@dataclass
class ScanKernel(Kernel):
    """One scan node (`stores[0]`: cumsum, cumprod, logcumsumexp; lowering/ops/scans.py): walks
    the scanned value's space `shape` as a reduction kernel walks rows, the scanned dim
    (`reduced`) along the tile's second axis, computing the value (its producers inlined) and
    combining it along that dim (plan/scan.py, codegen/scan.py)."""

    reduced: tuple[int, ...] = ()  # (the scanned dim,)
    looped: bool = False  # walks the scanned dim RBLOCK at a time, carrying the tiles before
    rblock: int = 0  # RBLOCK: the scanned dim's elements a program holds at once
    group: int = 0  # (never grouped: the reduction writer's field)
    grouped: list[str] = field(default_factory=list)

    @property
    def form(self) -> str:
        return f"looped, {self.rblock} a step" if self.looped else f"persistent, RBLOCK {self.rblock}"

    @property
    def name(self) -> str:
        """mc_scan_<its op, then the ops it computes, five>_<index>."""
        return _op_first("mc_scan", self.op_names, self.index)

    def headline(self) -> str:
        return (
            f"kernel {self.name}  stage {self.stage}  scan over {list(self.shape)} dim {self.reduced[0]} ({self.form})"
        )


@dataclass
class MatmulKernel(Kernel):
    """A matmul (`matmul`: an mm, addmm or bmm node) as a Triton template (codegen/matmul.py):
    tiles of its output `shape` ([B,] M, N) accumulated over K in float32, and what it `stores`
    evaluated at each tile's index in the store: its *epilogue* (plan/matmul.py), the pointwise
    values a kernel would compute from the product at the same element (bias, activation,
    residual, cast); the product itself only where something else reads it. `nodes` holds the
    matmul first, then the epilogue's nodes (and a chain's inner matmuls and theirs); `loads` its
    operands, then what the epilogue reads."""

    matmul: str = ""
    why: str = ""  # why the template runs it (plan/matmul.py `choice`)
    prologue: tuple[str, ...] = ()  # operands it computes as it loads them (their producers inlined), not read
    chained: tuple[MatmulKernel, ...] = ()  # the kernel of another matmul whose store is its prologue a (a chain)
    siblings: tuple[MatmulKernel, ...] = ()  # kernels of matmuls only its epilogue reads, computed here too

    @property
    def name(self) -> str:
        """mc_<the matmul's op>_<the epilogue's ops, five>_<index>."""
        words = [op.strip("_") for op in dict.fromkeys(self.op_names)]
        return f"mc_{'_'.join(words[:6])}_{self.index}"

    def headline(self) -> str:
        return f"kernel {self.name}  stage {self.stage}  matmul template over {list(self.shape)} ({self.why})"


@dataclass
class Extern:
    """An ATen call in the generated wrapper."""

    node: str
    stage: int


@dataclass(frozen=True)
class Refusal:
    """Why `producer` and `consumer` are not computed by one kernel."""

    producer: str
    consumer: str
    reason: str

    def __str__(self) -> str:
        return f"{self.producer} -> {self.consumer}: {self.reason}"


@dataclass
class Plan:
    """Everything codegen needs and nothing it must ask back."""

    graph: Graph
    steps: list[Kernel | Extern]
    materialized: set[str]
    refusals: list[Refusal]
    stage_of: dict[str, int]
    kinds: dict[str, NodeKind]  # node -> how it lowers
    strides: dict[str, tuple[int, ...]]  # value a kernel writes -> the strides it is allocated with
    spaces: dict[str, ReductionSpace] = field(default_factory=dict)  # node -> the reduction space it is in
    interior: dict[str, str] = field(default_factory=dict)  # value -> the padded buffer it is written inside
    donated: frozenset[str] = frozenset()  # inputs whose memory the call may take over once they die
    results_over_donated: bool = False  # whether a result may be written there too (codegen/reuse.py)
    rounded: frozenset[str] = frozenset()  # 16-bit values rounded wherever computed (plan/recompute.py)
    # values whose store keeps its last dim apart in the index (an SDPA mask, its rows padded to 8 at
    # some lengths and not at others: one kernel text at every length, fusion._aligned_masks)
    row_bounded: frozenset[str] = frozenset()

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def __str__(self) -> str:
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
                lines += step.describe()
            else:
                node = self.graph[step.node]
                lines.append(f"extern {step.node} = {node.op_name}  stage {step.stage}")
        if self.refusals:
            lines.append("not fused:")
            lines += [f"    {r}" for r in self.refusals]
        return "\n".join(lines)
