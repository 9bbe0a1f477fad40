"""`minicomp.explain(fn, *args)`: every stage of one compile, as text (and a picture on request).

    print(minicomp.explain(bias_gelu, x, b))                          # text only
    minicomp.explain(bias_gelu, x, b, image="bias_gelu.svg")          # also writes the picture

Sections: the captured ATen FX graph, the IR, the fusion plan (kernels,
extern calls, and why each edge that crosses a kernel boundary was not fused),
the generated module, its memory (the planned peak, what is alive then, and
for a training forward what it saves for the backward), the compile's stages,
and on a GPU the measured time of every kernel the call launched. With inputs that need gradients, forward and
backward each get the same sections. The picture (written only when `image`
names a file) draws the IR graph with each node colored by the kernel that
computes it (see `graph_svg`).

`minicomp explain [rope_fw|bias_relu|...] [--image FILE]` does this for a built-in workload.
"""

from __future__ import annotations

import argparse
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree

from minicomp.dispatch.autograd import TrainingEntry
from minicomp.dispatch.function import JitFunction

if TYPE_CHECKING:  # the compiler loads with the first compile, not with `import minicomp`
    from minicomp.pipeline import Compiled
    from minicomp.plan.fusion import Kernel

PALETTE = ["#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#f6bd60", "#84a59d", "#b5838d"]


@dataclass
class Explanation:
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, text)
    image: Path | None = None

    def __str__(self) -> str:
        return "\n\n".join(f"==== {title} ====\n{text.rstrip()}" for title, text in self.sections)


def explain(fn, *args, image: str | Path | None = None, **kwargs) -> Explanation:
    """Compile fn for these arguments and describe every stage; with `image` (a path ending in .svg),
    also write the graph picture there. Nothing is written otherwise."""
    jitted = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    entry = jitted.entry(*args, **kwargs)
    if isinstance(entry, TrainingEntry) and entry.backward is None:
        _run_backward_once(jitted, args, kwargs)  # AOTAutograd compiles the backward on first use
    graphs = (
        [("forward", entry.forward), ("backward", entry.backward)]
        if isinstance(entry, TrainingEntry)
        else [("", entry.compiled)]
    )
    if graphs[0][1] is None:
        return Explanation([("eager", f"{jitted.__name__} could not be compiled for these arguments; it runs eagerly")])
    report = Explanation()
    saved = _saved(entry) if isinstance(entry, TrainingEntry) else frozenset()
    for role, compiled in graphs:
        if compiled is None:
            continue
        tag = f" ({role})" if role else ""
        report.sections += [
            (f"captured ATen graph{tag}", compiled.fx.print_readable(print_output=False)),
            (f"IR{tag}", compiled.graph.describe(compiled.plan.kinds)),
            (
                f"fusion plan{tag}",
                str(compiled.plan) + ("" if compiled.plan.refusals else "\nnot fused: nothing (no edge was refused)"),
            ),
            *_matmuls(compiled, tag),
            (f"generated module{tag}", compiled.source),
            (
                f"memory{tag}",
                memory(compiled, saved if role == "backward" else frozenset(), saved if role == "forward" else ())
                + (_recomputed(compiled) if role == "backward" else ""),
            ),
            (f"compile time{tag}", compile_time(compiled)),
        ]
    if torch.cuda.is_available() and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        report.sections.append(("kernel times (GPU)", kernel_times(jitted, args, kwargs)))
    if image is not None:
        report.image = Path(image)
        report.image.write_text(graph_svg(graphs[0][1], title=f"{jitted.__name__}: fusion clusters"))
        report.sections.append(("image", f"graph with fusion clusters written to {report.image}"))
    return report


def _matmuls(compiled: Compiled, tag: str) -> list[tuple[str, str]]:
    """A section for the graph's matmuls, if it has any: each one's choice (a Triton template with
    its epilogue, or ATen's call) and why (plan/matmul.py); on a GPU, after the first call, the
    template's tile candidates' measured times (its tuning record)."""
    from minicomp.plan.matmul import choices
    from minicomp.runtime import cache
    from minicomp.runtime.launch_spec import RowProductsLaunch

    lines = choices(compiled.plan)
    for call in compiled.kernels:
        launch = compiled.launch(call)
        if call.kind == "matmul" and launch.device.type == "cuda" and launch.config is not None:
            if isinstance(launch.spec, RowProductsLaunch):  # one-row templates sharing a launch, untuned
                tiles = [piece.tiles[0][:3] for piece in launch.spec.pieces]
                lines.append(
                    f"  {call.name}: one launch of one-row templates at tiles {tiles}, {launch.config[1]} warps"
                )
                continue
            record = cache.read_record(launch.records.tuning_path(launch.spec.numel)) or {}
            timed = {  # "TILExwarps" -> ms, as tuning.py records it
                str(launch.spec.tile(int(k.split("x")[0]))[:3]): f"{ms:.4f} ms"
                for k, ms in record.get("ms", {}).items()
            }
            chosen = launch.spec.tile(launch.config[0])
            lines.append(
                f"  {call.name}: tile (BLOCK_M, BLOCK_N, BLOCK_K) {chosen[:3]}, {chosen[3]} warps, {chosen[4]} stages"
                f"; candidates timed: {timed or 'none (a small kernel takes the heuristic)'}"
            )
    return [(f"matmuls{tag}", "\n".join(lines))] if lines else []


def _saved(entry: TrainingEntry) -> frozenset[str]:
    """The values the forward hands the backward (its saved activations), by name."""
    from minicomp.dispatch.autograd import saved_activations

    if entry.forward is None or entry.backward is None:
        return frozenset()
    return saved_activations(entry.forward.fx, entry.backward.fx)


def memory(compiled: Compiled, freed: frozenset[str] = frozenset(), saved=()) -> str:
    """The planned peak of the generated `call` (plan/schedule.py's model: each buffer freed after
    the step that uses it last; the caller's inputs not counted, a backward's saved activations
    counted until their last use, `freed`), the memories alive then, and for a training forward
    what it saves for the backward (`saved`)."""
    from minicomp.ir import TensorMeta
    from minicomp.plan.schedule import peak
    from minicomp.plan.storages import nbytes

    mib = 2**20
    planned = peak(compiled.plan, freed)
    lines = [
        f"planned peak: {planned.bytes / mib:.3f} MiB, after {planned.step} (buffers freed after their last use; "
        f"{'saved activations counted until theirs, ' if freed else ''}the caller's inputs not counted)"
    ]
    for name, size in sorted(planned.alive.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"  {name}: {size / mib:.3f} MiB")
    metas = [(n, compiled.graph[n].meta) for n in sorted(saved) if n in compiled.graph.nodes]
    metas = [(n, m) for n, m in metas if isinstance(m, TensorMeta)]
    if metas:
        lines.append(f"saved for the backward: {len(metas)} values, {sum(nbytes(m) for _, m in metas) / mib:.3f} MiB")
        for name, meta in sorted(metas, key=lambda nm: -nbytes(nm[1]))[:12]:
            dtype = str(meta.dtype).removeprefix("torch.")
            lines.append(f"  {name}: {dtype}{list(meta.shape)} {nbytes(meta) / mib:.3f} MiB")
    return "\n".join(lines)


def _recomputed(compiled: Compiled) -> str:
    """A line naming the forward values this backward computes again by a checkpoint policy, not
    saved (dispatch/expanding_products.py: attention scores and their softmax; a user's policy),
    or nothing."""
    names = [n.name for n in compiled.fx.graph.nodes if n.meta.get("recompute") is not None and n.op == "call_function"]
    if not names:
        return ""
    return f"\nrecomputed here, not saved (checkpoint policy: expanding products): {', '.join(names)}"


def _run_backward_once(jitted: JitFunction, args, kwargs) -> None:
    """Forward and backward on copies of the arguments (the caller's .grad stays untouched)."""
    copy = lambda a: a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a  # noqa: E731
    outputs = [
        o
        for o in pytree.tree_leaves(jitted(*map(copy, args), **{k: copy(v) for k, v in kwargs.items()}))
        if isinstance(o, torch.Tensor) and o.requires_grad
    ]
    torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])


def compile_time(compiled: Compiled) -> str:
    """The compile's stages in seconds, and its kernels' Triton compiles and tuning once they ran
    (a GPU's first call; the CPU interprets, nothing compiles)."""
    lines = []
    for stage, value in compiled.breakdown().items():
        lines.append(f"{stage:16} {value:d}" if isinstance(value, int) else f"{stage:16} {value:.4f} s")
    return "\n".join(lines)


def kernel_times(jitted: JitFunction, args, kwargs, repeats: int = 20) -> str:
    """Median GPU time of each kernel one call launches, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    jitted(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            jitted(*args, **kwargs)
        torch.cuda.synchronize()
    rows = [
        (e.key, e.device_time_total / max(e.count, 1), e.count // repeats)
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return "\n".join(f"    {name:60} {us:9.2f} us  x{n}" for name, us, n in rows) or "    (no kernels recorded)"


# -- the picture ------------------------------------------------------------------


SVG_BOX = (150, 34, 60, 18)  # a node's width and height, the gaps between columns and rows


def graph_svg(compiled: Compiled, title: str = "") -> str:
    """The IR graph as SVG: one column per topological generation, nodes colored by kernel.

    White: graph inputs; gray: extern ATen calls; a color per kernel (legend at
    the bottom). A node drawn with a thick border is written to memory.
    """
    import networkx as nx

    graph, plan = compiled.graph, compiled.plan
    w, h, gap_x, gap_y = SVG_BOX
    columns = list(nx.topological_generations(graph.dag))
    pos = {
        n: (20 + i * (w + gap_x), 50 + j * (h + gap_y))
        for i, col in enumerate(columns)
        for j, n in enumerate(sorted(col, key=graph.order.index))
    }
    legend_y = 50 + max((len(c) for c in columns), default=1) * (h + gap_y) + 10
    width = max(20 + len(columns) * (w + gap_x), 400)
    height = legend_y + 24 * (len(plan.kernels) + 2)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
        'font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="20" y="25" font-size="14">{html.escape(title)}</text>',
    ]
    for a, b in graph.dag.edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(
            f'<line x1="{x1 + w}" y1="{y1 + h / 2}" x2="{x2}" y2="{y2 + h / 2}" stroke="#555" '
            'marker-end="url(#arrow)"/>'
        )
    out += _svg_nodes(compiled, pos) + _svg_legend(compiled, legend_y) + ["</svg>"]
    return "\n".join(out) + "\n"


def _svg_nodes(compiled: Compiled, pos: dict[str, tuple[int, int]]) -> list[str]:
    """Each node as a box at `pos`, filled with its kernel's color, its name and op inside."""
    graph, plan = compiled.graph, compiled.plan
    w, h, _, _ = SVG_BOX
    kernel_of: dict[str, Kernel] = {}
    for kernel in plan.kernels:
        for name in kernel.nodes + kernel.stores:
            kernel_of.setdefault(name, kernel)
    out = []
    for name, (x, y) in pos.items():
        node = graph[name]
        kernel = kernel_of.get(name)
        fill = "#ffffff" if node.is_input else "#d0d0d0" if kernel is None else PALETTE[kernel.index % len(PALETTE)]
        stroke = 3 if name in plan.materialized or name in graph.outputs else 1
        label = f"{name} (input)" if node.is_input else f"{name} = {node.op_name}"
        out.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="#222" '
            f'stroke-width="{stroke}"><title>{html.escape(label)} {html.escape(str(node.meta))}</title></rect>'
        )
        out.append(f'<text x="{x + 6}" y="{y + 14}">{html.escape(name[:20])}</text>')
        out.append(f'<text x="{x + 6}" y="{y + 27}" fill="#333">{html.escape(node.op_name[:20])}</text>')
    return out


def _svg_legend(compiled: Compiled, legend_y: int) -> list[str]:
    """A line per kernel (its color, what it reads and writes), then what the colors mean."""
    kernels = compiled.plan.kernels
    out = []
    for i, kernel in enumerate(kernels):
        y = legend_y + 24 * i
        out.append(
            f'<rect x="20" y="{y}" width="16" height="16" fill="{PALETTE[kernel.index % len(PALETTE)]}" stroke="#222"/>'
        )
        out.append(
            f'<text x="44" y="{y + 12}">{html.escape(kernel.name)}: {len(kernel.nodes)} ops, reads '
            f"{html.escape(', '.join(kernel.loads))}, writes {html.escape(', '.join(kernel.stores))}</text>"
        )
    y = legend_y + 24 * len(kernels)
    out.append(
        f'<text x="20" y="{y + 12}">gray: extern ATen call   white: input   thick border: written to memory</text>'
    )
    return out


# -- `minicomp explain` ---------------------------------------------------------------


def main(argv=None) -> int:
    from minicomp.tools.workloads import WORKLOADS

    examples = [name for name, work in WORKLOADS.items() if not work.backward]
    parser = argparse.ArgumentParser(
        prog="minicomp explain",
        description="Compile one built-in workload and print every stage: the captured graph, the IR, "
        "the fusion plan with the reason for each edge not fused, the generated module, compile times "
        "(and kernel times on a GPU).",
    )
    parser.add_argument(
        "example",
        nargs="?",
        default="rope_fw",
        metavar="WORKLOAD",
        help=f"default rope_fw; one of: {', '.join(examples)}",
    )
    parser.add_argument(
        "--image",
        default=None,
        metavar="FILE.svg",
        help="also write the graph, colored by kernel, to this file (default: no file is written)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    if args.example not in examples:
        parser.error(f"unknown workload {args.example!r}: choose from {', '.join(examples)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = WORKLOADS[args.example]
    size = work.sizes[0] if device.type == "cuda" else 8
    inputs = work.make(size, getattr(torch, args.dtype), device)
    print(explain(work.fn, *inputs, image=args.image))
    return 0
