"""The plan is the seam between fusion and codegen: kinds, loads, stores and layouts live in it,
the IR is never changed by it, and a compiled function's kernels can be reached without
knowing the generated module's argument order."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

import minicomp
from minicomp import capture, ir
from minicomp.codegen import render_module
from minicomp.lowering.ops import NodeKind
from minicomp.plan import fusion, steps
from minicomp.plan.steps import Kernel, PointwiseKernel, ReductionKernel


def mlp(x, w, b):
    return torch.sigmoid(torch.relu(x * 0.5 + 1.0) @ w + b)


def mlp_graph():
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    traced = capture.trace(mlp, [x, w, b], pytree.tree_flatten(((x, w, b), {}))[1], ["x", "w", "b"])
    return ir.from_fx(traced.gm, traced.input_names)


def compiled_plan(fn, *args):
    names = [f"a{i}" for i in range(len(args))]
    traced = capture.trace(fn, list(args), pytree.tree_flatten((args, {}))[1], names)
    return fusion.plan(ir.from_fx(traced.gm, traced.input_names))


def test_planning_leaves_the_graph_as_it_was():
    graph = mlp_graph()
    before = str(graph)
    plan = fusion.plan(graph)
    assert str(graph) == before and "#" not in before  # the IR prints no kinds: it has none
    assert plan.kinds["mm"] is NodeKind.EXTERN and plan.kinds["relu"] is NodeKind.POINTWISE
    assert plan.kinds["x"] is NodeKind.INPUT
    assert "mm: float32[4, 8] stride (8, 1) cpu = aten.mm.default(relu, w)  # extern" in graph.describe(plan.kinds)


def test_each_kernel_has_a_kind_and_the_plan_holds_every_output_layout():
    plan = fusion.plan(mlp_graph())
    assert [type(k) for k in plan.kernels] == [PointwiseKernel, PointwiseKernel]
    assert {name for k in plan.kernels for name in k.stores} == set(plan.strides)
    assert plan.kernels[1].loads == ["b", "mm"]


def test_rendering_twice_gives_the_same_module():
    """Codegen reads the plan and changes nothing in it."""
    plan = fusion.plan(mlp_graph())
    assert render_module(plan, "mlp").text == render_module(plan, "mlp").text


def test_codegen_takes_only_types_from_fusion():
    """Codegen never calls back into fusion: it imports the plan's data classes and nothing else."""
    codegen = Path(minicomp.__file__).parent / "codegen"
    imported = set()
    for path in codegen.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("minicomp.plan.fusion", "minicomp.plan.steps"):
                imported |= {a.name for a in node.names}
    types = {
        name for name, value in vars(steps).items() if isinstance(value, type) and value.__module__ == steps.__name__
    }
    assert imported <= types


MLP_PLAN = """\
kernel mc_fused_mul_add_relu_0  stage 0  space [4, 8]
    computes ['mul', 'add', 'relu']
    reads ['x']  writes ['relu']
extern mm = mm  stage 1
kernel mc_fused_add_sigmoid_1  stage 1  space [4, 8]
    computes ['add_1', 'sigmoid']
    reads ['b', 'mm']  writes ['sigmoid']
not fused:
    relu -> mm: mm runs as an ATen call: aten.mm has no pointwise, view or reduction lowering
    mm -> add_1: mm runs as an ATen call: aten.mm has no pointwise, view or reduction lowering"""

RMS_PLAN = """\
kernel mc_fused_pow_mean_add_rsqrt_mul_0  stage 0  reduction over [8, 64] dims [1] (persistent, RBLOCK 64)
    computes ['pow_1', 'mean', 'add', 'rsqrt', 'mul', 'mul_1']
    reads ['x', 'w']  writes ['mul_1']"""


def test_kernel_kinds_are_classes_with_only_their_own_fields():
    """A kernel's kind is its class (no string says it), and the plan prints as it always did."""
    plan = fusion.plan(mlp_graph())
    assert all(type(k) is PointwiseKernel and not hasattr(k, "kind") for k in plan.kernels)
    assert not hasattr(plan.kernels[0], "reduced") and str(plan) == MLP_PLAN
    described = plan.graph.describe(plan.kinds)
    assert "relu: float32[4, 8] stride (8, 1) cpu = aten.relu.default(add)  # pointwise" in described

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    x, w = torch.randn(8, 64), torch.randn(64)
    traced = capture.trace(rms, [x, w], pytree.tree_flatten(((x, w), {}))[1], ["x", "w"])
    plan = fusion.plan(ir.from_fx(traced.gm, traced.input_names))
    [kernel] = plan.kernels
    assert type(kernel) is ReductionKernel and not hasattr(kernel, "kind") and kernel.reduced == (1,)
    assert str(plan) == RMS_PLAN


def test_a_new_kernel_kind_is_a_class_that_describes_itself():
    """Adding a kind to the plan takes a class with its own fields and its headline; Plan's text
    needs no change."""

    @dataclasses.dataclass
    class ScanKernel(Kernel):
        dim: int = 0

        def headline(self) -> str:
            return f"kernel {self.name}  stage {self.stage}  scan over {list(self.shape)} dim {self.dim}"

    plan = fusion.plan(mlp_graph())
    scans = [ScanKernel(**vars(s), dim=1) if isinstance(s, Kernel) else s for s in plan.steps]
    text = str(dataclasses.replace(plan, steps=scans))
    assert text.splitlines()[0] == "kernel mc_fused_mul_add_relu_0  stage 0  scan over [4, 8] dim 1"
    assert (
        text.splitlines()[1:]
        == MLP_PLAN.splitlines()[1:4]
        + ["kernel mc_fused_add_sigmoid_1  stage 1  scan over [4, 8] dim 1"]
        + MLP_PLAN.splitlines()[5:]
    )


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


def test_a_reduction_read_by_an_extern_stays_before_it():
    """Regression: a row sum read by an ATen call (cosine_similarity's norms by clamp_min, here a
    cumsum) was moved into the kernel of a later reduction over the same rows that reads the
    call's result: kernel and call each waited for the other, the schedule dropped both, and the
    module returned a name it never made (NameError). The sum stays in its own, earlier kernel,
    and a plan whose steps read each other's values is refused before code is written."""
    x = torch.randn(4, 8)

    def fn(x):
        norms = x.abs().sum(-1, keepdim=True)
        return (x / torch.cumsum(norms, 0)).sum(-1)

    traced = capture.trace(fn, [x], pytree.tree_flatten(((x,), {}))[1], ["x"])
    plan = fusion.plan(ir.from_fx(traced.gm, traced.input_names))
    made = set(plan.graph.inputs)
    for step in plan.steps:
        reads = step.loads if isinstance(step, fusion.Kernel) else plan.graph[step.node].inputs()
        assert set(reads) <= made, step
        made |= set(step.stores) if isinstance(step, fusion.Kernel) else {step.node}
    assert torch.allclose(minicomp.jit(fn)(x), fn(x))


def test_a_plan_with_a_cycle_is_refused():
    from minicomp.plan import schedule

    x = torch.randn(4, 8)
    traced = capture.trace(lambda x: torch.cumsum(x * 2, 0) + 1, [x], pytree.tree_flatten(((x,), {}))[1], ["x"])
    plan = fusion.plan(ir.from_fx(traced.gm, traced.input_names))
    backwards = dataclasses.replace(plan, steps=list(reversed(plan.steps)))
    with pytest.raises(RuntimeError, match="reads what a later step"):
        schedule.order(backwards)


def test_values_sharing_nothing_that_read_large_computed_buffers_run_apart():
    """DLRM's backward casts each table's float32 gradient to bf16: in one kernel, every float32
    buffer was alive until it ran (625 MiB); apart, the schedule runs each cast right after its
    scatter. Values that share a load, or read only small buffers, stay one kernel."""
    from minicomp import config
    from minicomp.plan.schedule import order

    def fn(i, g, j):
        a = torch.zeros(64, 8).index_put((i,), g, accumulate=True)
        b = torch.zeros(64, 8).index_put((j,), g * 2, accumulate=True)
        return a.bfloat16(), b.bfloat16(), (g + 1).bfloat16(), (g * 3).bfloat16()

    i, g, j = torch.randint(0, 64, (32,)), torch.randn(32, 8), torch.randint(0, 64, (32,))
    casts = lambda p: sorted(k.stores for k in p.kernels if "_to_copy" in k.stores[0])  # noqa: E731
    assert casts(compiled_plan(fn, i, g, j)) == [["_to_copy", "_to_copy_1"], ["_to_copy_2", "_to_copy_3"]]
    with config.override(apart_bytes=1024):  # each scatter's [64, 8] float32 counts as large
        plan = compiled_plan(fn, i, g, j)
        assert casts(plan) == [["_to_copy"], ["_to_copy_1"], ["_to_copy_2", "_to_copy_3"]]
        ran = [s.stores[0] for s in order(plan).steps]
        assert ran.index("_to_copy") < ran.index("index_put_1")  # each cast right after its scatter
        assert "kept apart" in str(plan)
        torch.testing.assert_close(minicomp.jit(fn)(i, g, j), fn(i, g, j))
