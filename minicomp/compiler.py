"""The pipeline, in one function: ATen graph -> IR -> fusion plan -> source -> module.

    gm --ir.from_fx--> Graph --fusion.plan--> Plan --codegen--> source --runtime.load--> call

Every stage prints as readable text (`Compiled.graph`, `.plan`, `.source`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch.fx

from minicomp import codegen, fusion, ir, logs, runtime
from minicomp.codegen.families import Families
from minicomp.fusion import Plan
from minicomp.ir import Graph, TensorMeta


@dataclass
class Compiled:
    fx: torch.fx.GraphModule   # the captured ATen graph
    graph: Graph
    plan: Plan
    source: str
    call: Callable             # call(*input tensors) -> tuple of outputs
    interpret: bool            # runs through Triton's interpreter (CPU tensors)


def compile_graph(gm: torch.fx.GraphModule, name: str = "fn", input_names: list[str] | None = None,
                  families: Families | None = None) -> Compiled:
    """Compile one ATen graph. `families`: the kernel families of the function being compiled
    (codegen/families.py), so a new size of the same function reuses its kernels' text."""
    graph = ir.from_fx(gm, input_names)          # typed nodes over a networkx DiGraph
    logs.graph.info("%s: IR\n%s", name, graph)
    plan = fusion.plan(graph)                    # kinds, kernels, extern calls, their order, refusals
    logs.fusion.info("%s: plan\n%s\n%s", name, graph.describe(plan.kinds), plan)
    source = codegen.render_module(plan, name, families)   # Triton kernels + Python wrapper, as text
    logs.output_code.info("%s: module %s\n%s", name, runtime.module_name(source, name), source)
    interpret = _runs_on_cpu(graph)
    module = runtime.load(source, name, interpret)
    call = functools.partial(module.call, **graph.constants) if graph.constants else module.call
    return Compiled(gm, graph, plan, source, call, interpret)


def _runs_on_cpu(graph: Graph) -> bool:
    metas = [graph[n].meta for n in graph.order if isinstance(graph[n].meta, TensorMeta)]
    return all(m.device.type == "cpu" for m in metas)
