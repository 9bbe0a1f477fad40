"""A fusion plan -> the source of one Python module: Triton kernels + `call(*inputs)`.

`call` allocates what the kernels write, launches them, runs extern ATen ops in
between, copies mutated inputs back and returns the graph's outputs. Everything
that depends on the input signature (shapes, strides, element counts) is a
literal here, so a call does no work beyond launching; each kernel is launched
through a `Launch` (runtime/launch.py) that picks its configuration on the first call.

Each kernel is written by the writer of its plan class (`WRITERS`) into the
`KernelSource` of its kind, rendered with that source's template
(`templates/<kind>.py.j2`) and launched with its launch spec (runtime/launch_spec.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.codegen import (
    alike,
    aten_bindings,
    combo,
    matmul,
    meta_answers,
    pointwise,
    reduction,
    row_products,
    scan,
    scatter,
    view_layouts,
)
from minicomp.codegen.assigned import check_module
from minicomp.codegen.combo import Piece
from minicomp.codegen.families import Families
from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.reuse import extern_written_in_place, reused_in_place, scatter_written_in_place, written_in_place
from minicomp.codegen.templates import ENV
from minicomp.codegen.wrapper import conform_line, doc_line, extern_line, freed, method_view, safe_name
from minicomp.ir import TensorMeta
from minicomp.lowering.layout import attention_mask, mask_strides
from minicomp.plan.fusion import Extern, Kernel, Plan
from minicomp.plan.padded_writes import border
from minicomp.plan.steps import MatmulKernel, PointwiseKernel, ReductionKernel, ScanKernel, ScatterKernel
from minicomp.plan.storages import Storages
from minicomp.plan.storages import uses as step_uses

# the plan's kernel class -> its writer; each writer's source names its template and launch spec
WRITERS: dict[type, Callable[[Plan, Kernel], KernelSource]] = {
    PointwiseKernel: pointwise.write,
    ReductionKernel: reduction.write,
    ScatterKernel: scatter.write,
    ScanKernel: scan.write,
    MatmulKernel: matmul.write,
}


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch in a generated `call`: which launcher, with which arguments.

    The public way to run a generated kernel outside its module (experiments,
    the benchmark's bare-launch row): `arguments` puts buffers in launch order."""

    launcher: str  # the module attribute holding its Launch: "launch_0"
    name: str  # the kernel's name
    kind: str  # its kernel kind ("pointwise", "reduction")
    buffers: tuple[str, ...]  # graph values passed as pointers, in order (reads, then writes)
    writes: tuple[str, ...]  # the ones it stores
    scalars: tuple[int, ...]  # n_elements, then the runtime sizes of its family

    def arguments(self, values: dict) -> list:
        """Positional launch arguments, given a tensor for every name in `buffers`."""
        return [values[b] for b in self.buffers] + list(self.scalars)


@dataclass(frozen=True)
class ModuleSource:
    text: str  # the module's Python source
    kernels: list[KernelCall]  # its kernel launches, in the order `call` makes them


def render_module(plan: Plan, function: str = "fn", families: Families | None = None, probe=False) -> ModuleSource:
    """The module's source. `families`: the compiling function's kernel families (a fresh set when
    not given: every size a literal); `probe`: at a probe size, never compiled (families.py)."""
    body = _Body(plan, families if families is not None else Families(), probe)
    for at, step in enumerate(plan.steps):
        if isinstance(step, Extern):
            body.extern(at, step)
        else:
            body.kernel(at, step)
    wrapper = body.finish()
    graph = plan.graph
    text = ENV.get_template("module.py.j2").render(
        function=safe_name(function),
        device=body.device,
        runtime_names=sorted(body.runtime_names),
        inputs=[doc_line(_input_line(graph, n)) for n in graph.inputs],
        graph=[doc_line(line) for line in graph.describe(plan.kinds).splitlines()],
        plan=[doc_line(line) for line in str(plan).splitlines()],
        kernels=body.kernels,
        reductions=body.combines,
        args=graph.inputs + (["*"] + list(graph.constants) if graph.constants else []),
        inputs_names=graph.inputs,
        box=next(
            n
            for n in ("args", "boxed_args", *(f"args_{k}" for k in range(len(graph.order) + 1)))
            if n not in graph.nodes
        ),
        constants=list(graph.constants),
        wrapper=wrapper,
        no_torch_function=body.torch_level,
    )
    check_module(text, body.kernels, body.families.checked)  # a name read before it is assigned: refused now
    return ModuleSource(text, body.calls)


class _Body:
    """What `render_module` collects step by step: the kernels' texts and calls, the lines of
    `call` and the buffers each line touches. A pointwise kernel waits (`pending`) for the next
    kernel, which may share its launch."""

    def __init__(self, plan: Plan, families: Families, probe: bool = False):
        self.plan, self.graph, self.families, self.probe = plan, plan.graph, families, probe
        self.device = _device(plan)
        self.kernels: list[str] = []
        self.calls: list[KernelCall] = []
        self.runtime_names = {"Launch"}  # what the module imports from minicomp.runtime
        # a line calls torch's Python API (a binding: codegen/aten_bindings.py; a view method), which
        # dispatches __torch_function__: `call` runs with torch functions disabled then
        self.torch_level = False
        self.combines = False  # whether a kernel calls combine.py.j2's helpers (a reduction, a scan, a one-row matmul)
        self.wrapper: list[str] = []
        self.uses: list[set[str]] = []  # the buffers each line of `wrapper` touches
        self.storages = Storages.of(plan)
        self.last = {name: i for i, step in enumerate(plan.steps) for name in step_uses(plan, step)}
        self.dying: dict[int, list[str]] = {}  # step -> the names it uses last
        for name, i in self.last.items():
            self.dying.setdefault(i, []).append(name)
        self.pending: Piece | None = None  # a kernel whose launch may take the next one along
        self.rows: list[Piece] = []  # one-row templates waiting to share a launch (codegen/row_products.py)
        self.written: dict[str, str] = {}  # a mutated input's new value -> the input a kernel wrote it into
        self.alike = alike.Alike()  # which earlier kernel each one is alike to
        self.answers = meta_answers.Answers()  # meta kernels' answers, one per distinct question
        self.views = view_layouts.Views(plan, self.as_meta, self.answers)  # extern views made from their root buffer

    def line(self, text: str, uses: set[str]) -> None:
        self.wrapper.append(text)
        self.uses.append(uses)

    def extern(self, at: int, step: Extern) -> None:
        node = self.graph[step.node]
        in_place = extern_written_in_place(self.plan, self.storages, at)
        made = None if in_place is not None or attention_mask(node) else self.views.made(step.node)
        # a view made of a buffer no waiting one-row template writes does not launch them (a
        # weight's transposing view between q's, k's and v's products does not part them)
        waiting = {name for _, kernel in self.rows for name in kernel.stores}
        if made is None or self.pending or made.root in waiting:
            self.flush()
        if in_place is not None:  # ATen writes the input's new value into the input itself
            op, dst = in_place
            self.written[step.node] = dst
            line = extern_line(dataclasses.replace(node, target=op))
            self.line(f"{line}  # the input's new value, written in place", {step.node, *node.inputs()})
            return
        rename = self.aligned_mask(node)
        if made is not None:  # a view made from its root buffer at its meta layout: nothing to conform
            if made.line:
                self.runtime_names.add("reinterpret")
                self.line(made.line, {step.node, made.root})
            return
        asked = meta_answers.question("binding", node.target, node.args, node.kwargs, meta_of=self.meta_of)
        bound = self.answers.of(asked, lambda: aten_bindings.binding(node.target, node.args, node.kwargs, self.meta_of))
        self.torch_level |= bound is not None or method_view(node)
        self.line(extern_line(node, rename, bound), {step.node, *node.inputs(), *rename.values()})
        read = self.graph.users(step.node) or step.node in self.graph.outputs
        if isinstance(node.meta, TensorMeta) and read:  # the real layout may not be the meta kernel's
            self.runtime_names.add("conform")
            self.line(conform_line(node), {step.node})

    def meta_of(self, name: str):
        """The meta of value `name` (None for a local the graph does not name: a mask's aligned copy)."""
        node = self.graph.nodes.get(name)
        return None if node is None else node.meta

    def as_meta(self, name: str) -> bool:
        """Is value `name` laid out as its meta says when `call` runs: an input (guarded), an
        extern's output (conformed), a view made so, or a buffer allocated at those strides (not a
        broadcast written densely, not a mask padded for SDPA: plan.strides)?"""
        meta = self.graph[name].meta
        return isinstance(meta, TensorMeta) and tuple(self.plan.strides.get(name, meta.stride)) == tuple(meta.stride)

    def aligned_mask(self, node) -> dict[str, str]:
        """For an SDPA call on a GPU whose attention mask is laid out as its kernels refuse (an
        input, an ATen result or an output: a mask a kernel writes is allocated aligned, fusion.py),
        the line that copies the mask into an aligned layout; {mask: its copy's name}."""
        mask = attention_mask(node)
        if mask is None or self.graph[mask].meta.device.type == "cpu":
            return {}
        meta = self.graph[mask].meta
        padded = mask_strides(meta.shape, self.plan.strides.get(mask, meta.stride))
        if padded is None:
            return {}
        copy = next(
            n
            for n in (f"{mask}_aligned{k or ''}" for k in range(len(self.graph.order) + 1))
            if n not in self.graph.nodes
        )
        self.runtime_names.add("aligned")
        self.line(f"{copy} = aligned({mask}, {padded})", {mask, copy})
        return {mask: copy}

    def kernel(self, at: int, step: Kernel) -> None:
        source = WRITERS[type(step)](self.plan, step) if self.graph[step.stores[0]].meta.numel else None
        dying = self.dying.get(at, [])
        reused = reused_in_place(self.plan, self.storages, source, dying) if source else {}
        written = self.written_into_inputs(at, step, source)
        self.written.update(written)
        self.allocate(step, reused | written)
        if source is None:
            return
        source = self.families.generalize(source, self.probe)
        if row_products.piece(source, reused | written):
            joins = all(combo.independent(s, step) for _, s in self.rows) and (
                not self.rows or row_products.same_warps(self.rows[0][0], source)
            )
            if self.pending or not joins:
                self.flush()
            self.rows.append((source, step))
            return
        alone = not combo.combinable(source, reused | written)
        pending = self.pending
        if pending and not alone and combo.independent(pending[1], step) and combo.same_offsets(pending[0], source):
            self.pending = None
            self.launch([pending, (source, step)])
            return
        self.flush()
        if alone:
            self.launch([(source, step)])
        else:
            self.pending = (source, step)

    def written_into_inputs(self, at: int, step: Kernel, source: KernelSource | None) -> dict[str, str]:
        """Store -> the mutated input whose new value it is and that the kernel writes it into
        (codegen/reuse.py): a scatter's that starts as the input, any other kernel's by
        `written_in_place`."""
        if source is None:
            return {}
        if isinstance(step, ScatterKernel):  # (it loads only what its values and indexes read)
            dst = scatter_written_in_place(self.plan, self.storages, at, set(source.args) - {step.stores[0]})
            return {step.stores[0]: dst} if dst else {}
        return written_in_place(self.plan, self.storages, source, at)

    def allocate(self, step: Kernel, reused: dict[str, str]) -> None:
        """The lines that make each store's buffer: fresh memory, or a buffer's it takes over."""
        graph = self.graph
        if isinstance(step, ScatterKernel):  # filled, or a copy of its `self`: codegen/scatter.py
            self.flush()  # (after a waiting kernel, which may write that `self`)
            name = step.stores[0]
            if name in self.written:  # the mutated input it starts as, written in place
                self.line(f"{name} = {self.written[name]}  # the input's new value, written in place", {name})
                return
            self.line(*scatter.allocation(self.plan, step, self.empty))
            return
        for name in step.stores:
            meta = graph[name].meta
            if name in self.plan.interior:  # written inside its padded buffer: plan/padded_writes.py
                self.inside_padded(name, reused.get(name))
                continue
            if name in self.written:
                self.line(f"{name} = {self.written[name]}  # the input's new value, written in place", {name})
                continue
            if name in reused:
                buffer, layout = reused[name], (meta.shape, self.plan.strides[name])
                same = (
                    layout == (graph[buffer].meta.shape, graph[buffer].meta.stride) and name not in self.storages.kept
                )
                # (a result gets a tensor of its own over the memory: autograd may take it as a .grad;
                # reinterpret makes it in C++, as_strided through the dispatcher: ~1.5 us a call more)
                if not same:
                    self.runtime_names.add("reinterpret")
                view = f"reinterpret({buffer}, {tuple(layout[0])}, {tuple(layout[1])}, 0)"
                self.line(
                    f"{name} = {buffer if same else view}  # in {buffer}'s memory: read there, then not again",
                    {name, buffer},
                )
                continue
            self.line(f"{name} = {self.empty(meta, self.plan.strides[name])}", {name})

    def inside_padded(self, name: str, host: str | None = None) -> None:
        """The padded buffer (new, or over the memory of `host`, a donated input the kernel reads
        for the last time: codegen/reuse.py), its border zeroed, and `name` as the view of its
        interior."""
        padded = self.plan.interior[name]
        outer, inner = self.graph[padded].meta, self.graph[name].meta
        stride = tuple(self.plan.strides[padded])
        if host:
            self.runtime_names.add("over_or_empty")
            self.line(
                f"{padded} = over_or_empty({host}, {tuple(outer.shape)}, {stride}, {outer.dtype})"
                f"  # in {host}'s memory: read there, then not again",
                {padded, host},
            )
        else:
            self.line(f"{padded} = {self.empty(outer, stride)}", {padded})
        for dim, start, length in border(self.plan, name):
            self.line(f"{padded}.narrow({dim}, {start}, {length}).zero_()  # the padding", {padded})
        self.runtime_names.add("reinterpret")
        layout = f"{tuple(inner.shape)}, {tuple(self.plan.strides[name])}, 0"
        self.line(f"{name} = reinterpret({padded}, {layout})  # inside {padded}", {name, padded})

    def empty(self, meta: TensorMeta, stride: tuple[int, ...]) -> str:
        """The expression of a new buffer of `meta`'s shape and dtype at `stride`."""
        if meta.device.type == "cuda":
            self.runtime_names.add("empty_cuda")
            return f"empty_cuda({meta.device.index or 0}, {tuple(meta.shape)}, {tuple(stride)}, {meta.dtype})"
        return f"torch.empty_strided({meta.shape}, {stride}, dtype={meta.dtype}, device={str(meta.device)!r})"

    def flush(self) -> None:
        """Launch the kernel waiting for a partner, alone, or the one-row templates waiting, together."""
        if self.pending:
            pending, self.pending = self.pending, None
            self.launch([pending])
        if self.rows:
            rows, self.rows = self.rows, []
            self.launch(rows)

    def launch(self, pieces: list[Piece]) -> None:
        launcher = f"launch_{len(self.kernels)}"
        if len(pieces) == 1:
            [(source, _)] = pieces
            spec = source.launch_spec()
            text = ENV.get_template(source.template).render(
                **vars(source), spec=repr(spec), launcher=launcher, device=str(self.device)
            )
            args, scalars, name = list(source.args), (source.numel, *source.size_values), source.name
        elif isinstance(pieces[0][0], matmul.MatmulSource):
            text, args, scalars, name, spec = row_products.combined(pieces, launcher, self.device)
            self.runtime_names.add("MatmulLaunch")  # (its spec holds each piece's)
        else:
            text, args, scalars, name, spec = combo.combined(pieces, launcher, self.device)
        text = _checked(text, self.device)
        self.runtime_names.add(type(spec).__name__)
        first = self.alike.first(text, self.signature(args, scalars), launcher)  # one Launch binds one binary
        self.kernels.append(text.rstrip() if first == launcher else _bound_to(text, launcher, first))
        stores = tuple(n for _, kernel in pieces for n in kernel.stores)
        self.combines |= any(s.kind in ("reduction", "scan") or getattr(s, "row", False) for s, _ in pieces)
        self.calls.append(KernelCall(launcher, name, pieces[0][0].kind, tuple(args), stores, scalars))
        self.line(f"{launcher}({', '.join(args + [str(v) for v in scalars])})  # {name}", set(args))

    def signature(self, buffers: list[str], scalars: tuple) -> tuple:
        """What Triton specializes a launch's binary on, beyond its text: each buffer's dtype, the
        integers' values (== 1, divisibility; alignment is checked at each call)."""
        return tuple(self.graph[b].meta.dtype for b in buffers), tuple(scalars)

    def finish(self) -> list[str]:
        """The lines of `call`: the kernels' and extern calls', mutations copied back, each buffer
        deleted after its last use, the outputs returned."""
        self.flush()
        mutations = [(dst, src) for dst, src in self.graph.mutations if self.written.get(src) != dst]
        wrapper = self.wrapper + [f"{dst}.copy_({src})" for dst, src in mutations]
        uses = self.uses + [{dst, src} for dst, src in mutations]
        if self.written:  # as copy_ would: autograd sees the inputs written
            inputs = sorted(set(self.written.values()))
            wrapper.append(f"torch._C._increment_version([{', '.join(inputs)}])")
            uses.append(set(inputs) | set(self.written))
        wrapper = freed(wrapper, uses, self.graph)
        outputs = [o if isinstance(o, str) else repr(o) for o in self.graph.outputs]
        return wrapper + [f"return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})"]


def _input_line(graph, name: str) -> str:
    meta = graph[name].meta
    return f"{name}: {meta} stride {meta.stride}" if isinstance(meta, TensorMeta) else f"{name}: {meta}"


def _bound_to(text: str, launcher: str, first: str) -> str:
    """A kernel alike to an earlier one but for its names (codegen/alike.py): its header comment,
    then its launcher bound to the earlier kernel's `Launch` (one compile, one tuning for both)."""
    header = itertools.takewhile(lambda line: line.startswith("#"), text.lstrip().splitlines())
    return "\n".join([*header, f"{launcher} = {first}  # the same kernel as {first} but for its names"])


def _checked(text: str, device: torch.device) -> str:
    """A CUDA kernel with a device-side assert (an index in bounds: lowering's `Op.check`) is
    launched with `checked=True`, which compiles it with Triton's debug option (without it the
    assert is dropped), as Inductor compiles its kernels. Interpreted kernels need nothing."""
    if device.type == "cpu" or "tl.device_assert(" not in text:
        return text
    body, launch = text.rstrip().rsplit("\n", 1)
    return f"{body}\n{launch.removesuffix(')')}, checked=True)\n"


def _device(plan: Plan) -> torch.device:
    """The device the kernels run on: the graph's accelerator, if any (a CPU scalar may come first)."""
    devices = [plan.graph[n].meta.device for n in plan.graph.order if isinstance(plan.graph[n].meta, TensorMeta)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
