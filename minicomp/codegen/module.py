"""A fusion plan -> the source of one Python module: Triton kernels + `call(*inputs)`.

`call` allocates what the kernels write, launches them, runs extern ATen ops in
between, copies mutated inputs back and returns the graph's outputs. Everything
that depends on the input signature (shapes, strides, element counts) is a
literal here, so a call does no work beyond launching; each kernel is launched
through a `Launch` (launch.py) that picks its configuration on the first call.

Each kernel is written by the writer of its kind (`WRITERS`) and rendered with
that kind's template (`minicomp/templates/<kind>.py.j2`).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.codegen import pointwise, reduction
from minicomp.codegen.families import Families
from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.templates import ENV
from minicomp.ir import Ref, TensorMeta
from minicomp.lowering.layout import extent, is_dense
from minicomp.plan.fusion import Extern, Kernel, Plan
from minicomp.plan.storages import Storages
from minicomp.plan.storages import uses as step_uses

# kernel kind -> its writer; each kind's template is templates/<kind>.py.j2
WRITERS: dict[str, Callable[[Plan, Kernel], KernelSource]] = {
    "pointwise": pointwise.write,
    "reduction": reduction.write,
}


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch in a generated `call`: which launcher, with which arguments.

    The public way to run a generated kernel outside its module (experiments,
    the benchmark's bare-launch row): `arguments` puts buffers in launch order."""

    launcher: str  # the module attribute holding its Launch: "launch_0"
    name: str  # the kernel's name
    kind: str  # its kernel kind
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


def render_module(plan: Plan, function: str = "fn", families: Families | None = None) -> ModuleSource:
    """The module's source. `families`: the compiling function's kernel families (a fresh
    set when not given: every size a literal)."""
    families = families if families is not None else Families()
    graph = plan.graph
    device = _device(plan)
    kernels: list[str] = []
    calls: list[KernelCall] = []
    wrapper: list[str] = []
    uses: list[set[str]] = []  # the buffers each line of `wrapper` touches
    storages = Storages.of(plan)
    last = {name: i for i, step in enumerate(plan.steps) for name in step_uses(plan, step)}
    pending: tuple[KernelSource, Kernel] | None = None  # a kernel whose launch may take the next one along

    def launch(parts: list[tuple[KernelSource, Kernel]]) -> None:
        launcher = f"launch_{len(kernels)}"
        if len(parts) == 1:
            [(source, kernel)] = parts
            text = ENV.get_template(f"{kernel.kind}.py.j2").render(
                **vars(source), launcher=launcher, device=str(device)
            )
            args, scalars, name = list(source.args), (source.numel, *source.size_values), source.name
        else:
            text, args, scalars, name = _combo(parts, launcher, device)
        kernels.append(text.rstrip())
        stores = tuple(n for _, kernel in parts for n in kernel.stores)
        calls.append(KernelCall(launcher, name, parts[0][1].kind, tuple(args), stores, scalars))
        wrapper.append(f"{launcher}({', '.join(args + [str(v) for v in scalars])})  # {name}")
        uses.append(set(args))

    for at, step in enumerate(plan.steps):
        if isinstance(step, Extern):
            if pending:
                launch([pending])
                pending = None
            wrapper.append(_extern_line(graph[step.node]))
            uses.append({step.node, *graph[step.node].inputs()})
            continue
        source = WRITERS[step.kind](plan, step) if graph[step.stores[0]].meta.numel else None
        hosts = _hosts(plan, storages, source, [n for n, i in last.items() if i == at]) if source else {}
        for name in step.stores:
            meta = graph[name].meta
            if name in hosts:
                host, layout = hosts[name], (meta.shape, plan.strides[name])
                same = layout == (graph[host].meta.shape, graph[host].meta.stride)
                wrapper.append(
                    f"{name} = {host if same else f'{host}.as_strided{layout}'}"
                    f"  # in {host}'s memory: read there, then not again"
                )
                uses.append({name, hosts[name]})
                continue
            wrapper.append(
                f"{name} = torch.empty_strided({meta.shape}, {plan.strides[name]}, "
                f"dtype={meta.dtype}, device={str(meta.device)!r})"
            )
            uses.append({name})
        if source is None:
            continue
        source = families.generalize(source)
        alone = not _combinable(source, step, hosts)
        if (
            pending
            and not alone
            and _independent(pending[1], step)
            and (pending[0].wide_index, pending[0].parts) == (source.wide_index, source.parts)
        ):
            launch([pending, (source, step)])
            pending = None
            continue
        if pending:
            launch([pending])
            pending = None
        if alone:
            launch([(source, step)])
        else:
            pending = (source, step)
    if pending:
        launch([pending])
    wrapper += [f"{dst}.copy_({src})" for dst, src in plan.graph.mutations]
    uses += [{dst, src} for dst, src in plan.graph.mutations]
    wrapper = _freed(wrapper, uses, graph)
    outputs = [o if isinstance(o, str) else repr(o) for o in graph.outputs]
    wrapper.append(f"return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})")
    text = ENV.get_template("module.py.j2").render(
        function=safe_name(function),
        device=device,
        inputs=[
            _doc(
                f"{n}: {graph[n].meta} stride {graph[n].meta.stride}"
                if isinstance(graph[n].meta, TensorMeta)
                else f"{n}: {graph[n].meta}"
            )
            for n in graph.inputs
        ],
        graph=[_doc(line) for line in graph.describe(plan.kinds).splitlines()],
        plan=[_doc(line) for line in str(plan).splitlines()],
        kernels=kernels,
        reductions=any(call.kind == "reduction" for call in calls),
        args=graph.inputs + (["*"] + list(graph.constants) if graph.constants else []),
        inputs_names=graph.inputs,
        box=next(
            n
            for n in ("args", "boxed_args", *(f"args_{k}" for k in range(len(graph.order) + 1)))
            if n not in graph.nodes
        ),
        constants=list(graph.constants),
        wrapper=wrapper,
    )
    return ModuleSource(text, calls)


def _combinable(source: KernelSource, kernel: Kernel, hosts: dict[str, str]) -> bool:
    """Whether a kernel may share a launch with a neighbour (issue #18: RoPE's q with 32 heads and
    k with 8 are two iteration spaces, so two kernels; one launch has one tail, not two): a
    pointwise kernel without runtime sizes (a family member keeps its own launch), not
    writing in place (`_hosts`) and walking its blocks in order (codegen/plane_order.py). The
    caller also asks the pair to be independent and to write the same elements per offset
    (`parts`). The second kernel's outputs are then allocated before the first runs (the decoder
    block's peak did not move: 662.6 MiB)."""
    return kernel.kind == "pointwise" and not source.sizes and not hosts and not source.planes


def _independent(first: Kernel, second: Kernel) -> bool:
    """Neither reads what the other writes: their programs may run in any order."""
    return not (set(second.loads) & set(first.stores) or set(first.loads) & set(second.stores))


def _combo(parts: list[tuple[KernelSource, Kernel]], launcher: str, device) -> tuple[str, list[str], tuple, str]:
    """(text, buffers, scalars, name) of one launch for two pointwise kernels
    (templates/combo.py.j2): each kernel's body becomes a @triton.jit function of its own (its
    names stay its own), called by the programs of its range."""
    buffers = list(dict.fromkeys(b for source, _ in parts for b in source.args))
    name = "_".join(source.name for source, _ in parts)[:120]
    text = ENV.get_template("combo.py.j2").render(
        parts=[source for source, _ in parts],
        calls=[[f"{b}_ptr" for b in source.args] for source, _ in parts],
        name=name,
        params=[f"{b}_ptr" for b in buffers],
        numel=sum(source.numel for source, _ in parts),
        pieces=tuple(source.numel for source, _ in parts),
        elements_per_offset=parts[0][0].parts,
        launcher=launcher,
        device=str(device),
    )
    return text, buffers, tuple(source.numel for source, _ in parts), name


def _hosts(plan: Plan, storages: Storages, source: KernelSource, dying: list[str]) -> dict[str, str]:
    """Store -> a buffer the kernel reads for the last time whose memory it can write it into, as
    Inductor's in-place buffer reuse does: the kernel's own intermediate (not an input, output or
    view of something), dense, of the store's dtype and large enough, and read only at the store's
    own address, so each element is read by the program that overwrites it, before it does (any
    shape: the addresses are what match). A backward's gradient of the MLP's hidden state goes
    into the matmul result it came from."""
    graph, hosts, taken = plan.graph, {}, set()
    for name in source.kernel.stores:
        meta = graph[name].meta
        if name in storages.kept:  # an output is its own tensor, never a view of a dead intermediate
            continue
        for buffer in source.aligned.get(name, ()):
            other = graph[buffer].meta
            if (
                buffer in dying
                and buffer not in taken
                and storages.owns_memory(buffer)
                and buffer not in storages.inputs | storages.kept
                and isinstance(other, TensorMeta)
                and (other.dtype, other.device) == (meta.dtype, meta.device)
                and other.stride == plan.strides.get(buffer, other.stride)
                and is_dense(other.shape, other.stride)  # it is all its memory
                and extent(meta.shape, plan.strides[name]) <= other.numel
            ):
                hosts[name] = buffer
                taken.add(buffer)
                break
    return hosts


def _freed(lines: list[str], uses: list[set[str]], graph) -> list[str]:
    """`lines` with a `del` after the last line that touches each intermediate buffer, as
    Inductor's wrapper does: a local lives until `call` returns, so without it the peak memory
    of a call is the sum of all its intermediates (a decoder block's backward held twice
    Inductor's peak). Inputs go too (`call_boxed` empties its argument list: a backward's saved
    activations are freed as it goes); outputs are left alone."""
    kept = {o for o in graph.outputs if isinstance(o, str)}
    last = {}
    for i, names in enumerate(uses):
        for name in names:
            last[name] = i
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        dead = sorted(n for n, at in last.items() if at == i and n not in kept)
        if dead:
            out.append(f"del {', '.join(dead)}")
    return out


def safe_name(text: str) -> str:
    """A user's name (a function's __name__) as it may appear in generated text: [A-Za-z0-9_]."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)[:80] or "fn"


def _doc(line: str) -> str:
    """A line for the module's docstring: no backslash escapes, no closing quotes."""
    return line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def _device(plan: Plan) -> torch.device:
    """The device the kernels run on: the graph's accelerator, if any (a CPU scalar may come first)."""
    devices = [plan.graph[n].meta.device for n in plan.graph.order if isinstance(plan.graph[n].meta, TensorMeta)]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


# view ops called as the tensor's method, the same ATen op without the OpOverload's Python
# call (~2.3 us -> ~0.8 us a call: a decoder block's backward makes some 40 of them)
METHODS = {"aten.view.default": "view", "aten.permute.default": "permute", "aten.unsqueeze.default": "unsqueeze"}


def _extern_line(node) -> str:
    if node.target is operator.getitem:
        return f"{node.name} = {render_arg(node.args[0])}[{node.args[1]!r}]"
    method = METHODS.get(str(node.target))
    if method and not node.kwargs and len(node.args) == 2 and isinstance(node.args[0], Ref):
        return f"{node.name} = {node.args[0].name}.{method}({render_arg(node.args[1])})"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        call = f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    else:
        call = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
    if not DOTTED.fullmatch(call):
        raise NotImplementedError(f"cannot call {call!r} from generated code")
    args = [render_arg(a) for a in node.args] + [f"{k}={render_arg(v)}" for k, v in node.kwargs.items()]
    return f"{node.name} = {call}({', '.join(args)})"


DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
SIMPLE = (type(None), bool, int, float, complex, str)


def render_arg(value) -> str:
    """An FX argument as Python source inside the wrapper (only values with a literal form)."""
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(render_arg(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f'float("{value}")'
    if type(value) not in SIMPLE:
        raise NotImplementedError(f"an argument of type {type(value).__name__} has no literal form")
    return repr(value)
