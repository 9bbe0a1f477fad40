"""The pipeline, in one function: ATen graph -> IR -> fusion plan -> source -> module.

    gm --ir.from_fx--> Graph --common_subexpressions, whole_scatters, pad_matmuls, split_reductions--> Graph
       --fusion.plan--> Plan
       --codegen--> source --runtime.load--> call

`write_graph` runs the stages up to the source (a dynamic graph's probe size: nothing compiled);
`compile_graph` runs them all. Every stage prints as readable text (`Compiled.graph`, `.plan`,
`.source`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx

from minicomp import codegen, gc_pause, ir, logs, runtime
from minicomp.codegen.families import Families
from minicomp.codegen.module import WRITERS, KernelCall, ModuleSource
from minicomp.ir import Graph, TensorMeta
from minicomp.ir.cse import common_subexpressions
from minicomp.ir.whole_scatters import whole_scatters
from minicomp.lowering.layout import is_dense
from minicomp.lowering.ops import NodeKind
from minicomp.plan import fusion, schedule
from minicomp.plan.fusion import Plan
from minicomp.plan.pad_matmuls import pad_matmuls
from minicomp.plan.padded_writes import written_padded
from minicomp.plan.split_reductions import split_reductions
from minicomp.plan.steps import PointwiseKernel, ReductionKernel
from minicomp.runtime.launch import Launch


@dataclass
class Compiled:
    fx: torch.fx.GraphModule  # the captured ATen graph
    graph: Graph
    plan: Plan
    source: str
    call: Callable  # call(*input tensors) -> tuple of outputs
    boxed: Callable  # boxed([input tensors]) -> tuple of outputs; empties the list (AOTAutograd's convention)
    interpret: bool  # runs through Triton's interpreter (CPU tensors)
    module: types.ModuleType  # the generated module
    kernels: list[KernelCall]  # its kernel launches, in order
    times: dict[str, float] = field(default_factory=dict)  # seconds of each compile stage (`breakdown`)
    renamed: dict[str, str] = field(default_factory=dict)  # fx node name -> the IR's, where they differ

    def rounded_values(self) -> frozenset[str]:
        """The fx names of the 16-bit values rounded wherever this graph computes them
        (`Plan.rounded`): a training forward's, for its backward's `compile_graph(rounded=...)`."""
        computed = (n.name for n in self.fx.graph.nodes if n.op == "call_function")
        return frozenset(name for name in computed if self.renamed.get(name, name) in self.plan.rounded)

    def breakdown(self) -> dict[str, float]:
        """Seconds this graph's compile spent: its stages (capture when function.py traced it,
        ir, plan, codegen, load, starting the compiles ahead) and, once the kernels have run, the
        first calls' waits for their Triton compiles (or loads of a binary an earlier process
        compiled; the compiles run in threads, side by side) and launch-config tuning; and the
        counts: kernels whose binary came through Triton's JIT or from a record, and the binaries
        Triton compiled (tuning candidates included)."""
        launches = list({id(la): la for la in map(self.launch, self.kernels)}.values())  # alike kernels share one
        return self.times | {
            "triton compile": sum(la.times.get("compile", 0.0) for la in launches),
            "tuning": sum(la.times.get("tune", 0.0) for la in launches),
            "kernels compiled": sum(1 for la in launches if la.jit_compiled is True),
            "kernels loaded": sum(1 for la in launches if la.jit_compiled is False),
            "triton compiles": sum(la.compiles for la in launches),
        }

    def launch(self, kernel: KernelCall) -> Launch:
        """The `Launch` (launch.py) of one of `kernels`: `.kernel` is the @triton.jit function."""
        return getattr(self.module, kernel.launcher)

    def bare_arguments(self, kernel: KernelCall, inputs: list[torch.Tensor]) -> list:
        """Launch arguments for `kernel` on these graph inputs, with fresh outputs: for running
        one kernel of a one-kernel module by hand (the benchmark's bare Triton launch)."""
        values = dict(zip(self.graph.inputs, inputs))
        for name in kernel.writes:
            meta = self.graph[name].meta
            values[name] = torch.empty_strided(
                meta.shape, self.plan.strides[name], dtype=meta.dtype, device=meta.device
            )
        missing = [b for b in kernel.buffers if b not in values]
        if missing:
            raise ValueError(f"{kernel.name} reads {missing}, which are not graph inputs")
        return kernel.arguments(values)


@dataclass
class Written:
    """A graph through the stages up to its source (`write_graph`)."""

    graph: Graph
    plan: Plan
    rendered: ModuleSource  # the module's text and its kernel launches
    renamed: dict[str, str]  # fx node name -> the IR's, where they differ
    clock: _Clock  # the stages' seconds so far


@gc_pause.pausing  # (its objects are short-lived: the collector's full walks would cost seconds)
def compile_graph(
    gm: torch.fx.GraphModule,
    name: str = "fn",
    input_names: list[str] | None = None,
    families: Families | None = None,
    **options,
) -> Compiled:
    """Compile one ATen graph: `write_graph`'s stages (`options`: its keyword arguments), then the
    module loaded and its kernels' Triton compiles started."""
    written = write_graph(gm, name, input_names, families, **options)
    graph, source, clock = written.graph, written.rendered.text, written.clock
    interpret = _runs_on_cpu(graph)
    module = _parsing(runtime.load, source, name, interpret)
    clock.lap("load")
    if not interpret:
        _compile_ahead(module, written.rendered.kernels, graph)
        clock.lap("compile ahead")  # starting it: the compiles run in threads until the first call needs them
    call = functools.partial(module.call, **graph.constants) if graph.constants else module.call
    boxed = functools.partial(module.call_boxed, **graph.constants) if graph.constants else module.call_boxed
    boxed._boxed_call = True  # AOTAutograd's mark: it passes its argument list, which `boxed` may empty
    return Compiled(
        gm, graph, written.plan, source, call, boxed, interpret, module, written.rendered.kernels, clock.times,
        written.renamed,
    )  # fmt: skip


@gc_pause.pausing
def write_graph(
    gm: torch.fx.GraphModule,
    name: str = "fn",
    input_names: list[str] | None = None,
    families: Families | None = None,
    freed_inputs: frozenset[str] = frozenset(),
    output_layouts: list[tuple[int, ...] | None] | None = None,
    any_layout: frozenset[str] = frozenset(),
    donated: frozenset[str] = frozenset(),
    results_over_donated: bool = False,
    inference: bool = False,
    saved: frozenset[str] = frozenset(),
    recomputed: frozenset[str] = frozenset(),
    rounded: frozenset[str] = frozenset(),
    probe: bool = False,
) -> Written:
    """One ATen graph through IR, plan and codegen: its module's source, nothing loaded or compiled.
    `families`: the kernel families of the function being compiled
    (codegen/families.py), so a new size of the same function reuses its kernels' text; writing a
    graph makes its kernels members of them.
    `freed_inputs`: inputs the caller hands over (a backward's saved activations), so the order
    of the steps may count on their memory going at their last use (schedule.py).
    `output_layouts`: strides wanted for the outputs, by position (a backward's: its leaves').
    `any_layout`: outputs that may come out at any strides (a forward's saved activations that its
    backward reads at any strides: dispatch/saved_layouts.py).
    `donated`: freed inputs whose memory no other tensor reaches (AOTAutograd's donated buffers: a
    backward's saved activations that are no input or output of the user's), which a kernel may
    write its store over where they die (codegen/reuse.py); a result of the call too where
    `results_over_donated` (no CUDA graph replays it: a forward replay would write over the memory
    a caller's gradient then lives in).
    `inference`: no backward graph follows this one and recomputes its values (plan/recompute.py:
    16-bit values may be written to save later kernels' reads).
    `saved`: a training forward's values its backward reads (dispatch/saved_layouts.py): a 16-bit
    one is rounded wherever the forward computes it, so the forward's own uses see the value the
    backward loads (`Plan.rounded`).
    `recomputed`: a training forward's values its backward computes again (saved_layouts.py); a
    16-bit one a selection is computed from is rounded too (recompute.compared).
    `rounded`: a backward's values its forward rounded where it computed them (the forward's
    `Compiled.rounded_values`), rounded here too: each graph computes them as the other does.
    `probe`: the graph at a probe size (capture/specialize.py), written for its kernel families
    alone, never compiled."""
    clock = _Clock()
    graph = ir.from_fx(gm, input_names)  # typed nodes over a networkx DiGraph
    renamed = ir.fx_names(gm, input_names)
    rounding = {  # (fusion.plan's arguments that decide which 16-bit values are rounded where computed)
        "saved": _as_named_in(graph, gm, saved),
        "recomputed": frozenset(renamed.get(n, n) for n in recomputed) & set(graph.nodes),
        "rounded": frozenset(renamed.get(n, n) for n in rounded) & set(graph.nodes),
    }
    graph = common_subexpressions(graph)  # an op computed twice on the same arguments computed once
    graph = whole_scatters(graph)  # a slice's gradient over its whole base: the gradient, no zeros
    graph = pad_matmuls(graph, any_layout)  # matmul sizes that keep cuBLAS off its fast kernels padded with zeros
    graph = split_reductions(graph)  # long reductions with few rows become partials + their combination
    logs.graph.info("%s: IR\n%s", name, graph)
    clock.lap("ir")
    plan = fusion.plan(graph, inference=inference, **rounding)  # kinds, kernels, extern calls, their order, refusals
    if donated:
        plan = dataclasses.replace(plan, donated=donated & freed_inputs, results_over_donated=results_over_donated)
    plan = schedule.order(plan, freed_inputs)  # the order of the steps: the lower peak memory, views late
    plan = _with_output_layouts(plan, output_layouts or [])  # a gradient in its leaf's layout
    plan = written_padded(plan)  # a padded value written inside its padded buffer, no copy
    if logs.fusion.isEnabledFor(logging.INFO):  # (describing a graph costs a few ms a kernel)
        logs.fusion.info("%s: plan\n%s\n%s", name, graph.describe(plan.kinds), plan)
    clock.lap("plan")
    try:
        rendered = _parsing(codegen.render_module, plan, name, families, probe)  # Triton kernels + Python wrapper
    except NotImplementedError as err:  # a kernel it cannot write: once more, that kernel's reductions unfused
        plan = _unfused(plan, err, name, freed_inputs, output_layouts or [], inference, rounding)
        rendered = _parsing(codegen.render_module, plan, name, families, probe)
    logs.output_code.info("%s: module %s\n%s", name, runtime.module_name(rendered.text, name), rendered.text)
    clock.lap("codegen")
    return Written(graph, plan, rendered, renamed, clock)


def _as_named_in(graph: ir.Graph, gm: torch.fx.GraphModule, returned: frozenset[str]) -> frozenset[str]:
    """`returned`, values `gm` returns, as the IR `graph` names them (by output position: ir.from_fx
    renames a node whose name a kernel's text reserves)."""
    if not returned:
        return frozenset()
    result = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    flat = list(result) if isinstance(result, (list, tuple)) else [result]
    return frozenset(
        graph.outputs[i] for i, v in enumerate(flat) if isinstance(v, torch.fx.Node) and v.name in returned
    )


def _parsing(stage: Callable, *args):
    """`stage(*args)` for a stage that parses Python (codegen's checks read the module with `ast`;
    loading makes Triton parse each kernel), once more where CPython 3.11's `ast` failed
    spuriously: "AST constructor recursion depth mismatch" (cpython#106905: its depth counter is
    shared by the process, so a parse run meanwhile, by another thread or a finalizer, upsets it).
    The stages are pure: the second run writes what the first would have."""
    try:
        return stage(*args)
    except SystemError as err:
        if "recursion depth mismatch" not in str(err):
            raise
        logs.cache.info("%s: a spurious SystemError from Python's ast (%s); run again", stage.__name__, err)
        return stage(*args)


def _unfused(
    plan: Plan, err: NotImplementedError, name: str, freed_inputs, layouts, inference: bool, rounding: dict
) -> Plan:
    """The plan again with each reduction kernel that codegen cannot write broken up: every edge
    from one of its reductions to a node it computes cut (fusion.plan's `cut`), so each reduction
    is written and its readers read it in a later kernel. Defence in depth behind fusion's rules
    (a plan rule should have refused the fusion): it costs those kernels their fusion, not the
    graph its compilation. Raises `err` when no kernel fails on its own."""
    failing = [k for k in plan.kernels if isinstance(k, ReductionKernel) and _unwritable(plan, k)]
    computed = {n for k in failing for n in k.nodes}
    cut = {
        (r, u)
        for k in failing
        for r in k.nodes
        if plan.kinds[r] is NodeKind.REDUCTION
        for u in plan.graph.users(r)
        if u in computed
    }
    if not cut:
        raise err
    logs.fusion.warning(
        "%s: codegen could not write %s (%s); planned again with their reductions unfused",
        name,
        ", ".join(k.name for k in failing),
        err,
    )
    again = fusion.plan(plan.graph, frozenset(cut), inference=inference, **rounding)
    again = dataclasses.replace(again, donated=plan.donated, results_over_donated=plan.results_over_donated)
    again = schedule.order(again, freed_inputs)
    again = written_padded(_with_output_layouts(again, layouts))
    if logs.fusion.isEnabledFor(logging.INFO):
        logs.fusion.info("%s: plan\n%s\n%s", name, again.graph.describe(again.kinds), again)
    return again


def _unwritable(plan: Plan, kernel) -> bool:
    """Whether codegen's writer of `kernel`'s kind raises NotImplementedError for it."""
    try:
        WRITERS[type(kernel)](plan, kernel)
    except NotImplementedError:
        return True
    return False


def _with_output_layouts(plan: Plan, layouts: list[tuple[int, ...] | None]) -> Plan:
    """The plan with each output a pointwise kernel writes, and nothing else reads, allocated with
    the strides `layouts` gives its position (when they lay its shape out densely, without
    overlap): a backward's input gradients in their leaves' layouts (autograd.input_layouts).
    The kernel walks its space in the order of those strides, so its stores stay contiguous."""
    graph, strides = plan.graph, dict(plan.strides)
    pointwise = {name for k in plan.kernels if isinstance(k, PointwiseKernel) for name in k.stores}
    for name, wanted in zip(graph.outputs, layouts):
        if not isinstance(name, str) or wanted is None or name not in pointwise or graph.users(name):
            continue
        meta = graph[name].meta
        if graph.outputs.count(name) != 1 or len(wanted) != meta.ndim or not is_dense(meta.shape, wanted):
            continue
        strides[name] = tuple(wanted)
    return plan if strides == plan.strides else dataclasses.replace(plan, strides=strides)


def _compile_ahead(module: types.ModuleType, kernels: list[KernelCall], graph: Graph) -> None:
    """Start every kernel's Triton compile now, in threads (launch.py `prepare`), each for the
    argument types its launch will get: the buffers' dtypes and the literal integers."""
    for kernel in kernels:
        signature = [graph[b].meta.dtype for b in kernel.buffers] + list(kernel.scalars)
        getattr(module, kernel.launcher).prepare(signature)


class _Clock:
    """Seconds between laps, by name."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = now - self.last
        self.last = now


def _runs_on_cpu(graph: Graph) -> bool:
    metas = [graph[n].meta for n in graph.order if isinstance(graph[n].meta, TensorMeta)]
    return all(m.device.type == "cpu" for m in metas)
