"""The plan is the seam between fusion and codegen: kinds, loads, stores and layouts live in it,
the IR is never changed by it, and a compiled function's kernels can be reached without
knowing the generated module's argument order."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

import minicomp
from minicomp import capture, fusion, ir
from minicomp.codegen import render_module


def mlp(x, w, b):
    return torch.sigmoid(torch.relu(x * 0.5 + 1.0) @ w + b)


def mlp_graph():
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    traced = capture.trace(mlp, [x, w, b], pytree.tree_flatten(((x, w, b), {}))[1], ["x", "w", "b"])
    return ir.from_fx(traced.gm, traced.input_names)


def test_planning_leaves_the_graph_as_it_was():
    graph = mlp_graph()
    before = str(graph)
    plan = fusion.plan(graph)
    assert str(graph) == before and "#" not in before  # the IR prints no kinds: it has none
    assert plan.kinds["mm"] == "extern" and plan.kinds["relu"] == "pointwise" and plan.kinds["x"] == "input"
    assert "mm: float32[4, 8] stride (8, 1) cpu = aten.mm.default(relu, w)  # extern" in graph.describe(plan.kinds)


def test_each_kernel_has_a_kind_and_the_plan_holds_every_output_layout():
    plan = fusion.plan(mlp_graph())
    assert [k.kind for k in plan.kernels] == ["pointwise", "pointwise"]
    assert {name for k in plan.kernels for name in k.stores} == set(plan.strides)
    assert plan.kernels[1].loads == ["b", "mm"]


def test_rendering_twice_gives_the_same_module():
    """Codegen reads the plan and changes nothing in it."""
    plan = fusion.plan(mlp_graph())
    assert render_module(plan, "mlp").text == render_module(plan, "mlp").text


def test_codegen_takes_only_types_from_fusion():
    """Codegen never calls back into fusion: it imports its data classes and nothing else."""
    codegen = Path(minicomp.__file__).parent / "codegen"
    imported = set()
    for path in codegen.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "minicomp.fusion":
                imported |= {a.name for a in node.names}
    assert imported <= {"Kernel", "Plan", "Extern"}


def test_a_compiled_kernel_runs_bare_through_the_public_accessors():
    x, b = torch.randn(6, 5), torch.randn(5)
    compiled = minicomp.jit(lambda x, b: torch.relu(x + b)).compiled(x, b)
    [kernel] = compiled.kernels
    assert kernel.kind == "pointwise" and kernel.scalars[0] == 30
    launch = compiled.launch(kernel)
    args = compiled.bare_arguments(kernel, [x, b])
    launch.kernel[(1,)](*args, BLOCK_SIZE=32)
    out = args[kernel.buffers.index(kernel.writes[0])]
    torch.testing.assert_close(out, torch.relu(x + b))
