"""joint_cse.merged against functorch's `fx_graph_cse` on AOTAutograd joint graphs: the same graph,
node for node, and the partition then never imports Inductor's pattern matcher."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from minicomp.dispatch import joint_cse


def joints(fn, *args) -> list[torch.fx.GraphModule]:
    """The joint graphs AOTAutograd hands its partition for `fn(*args)` (a copy of each)."""
    from functorch.compile import aot_function, default_partition

    seen = []

    def partition(joint, inputs, **kwargs):
        seen.append(torch.fx.GraphModule(joint, joint.graph))
        return default_partition(joint, inputs, **kwargs)

    aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=partition)(*args)
    return seen


def repeated(x, w):
    a = torch.sin(x) @ w
    b = torch.sin(x) @ w  # the same product again
    return (F.gelu(a) + F.gelu(b)).sum() + torch.cos(x).sum() + torch.cos(x).mean()


def with_mutation(x, w):
    y = x * 2
    z = y.relu()
    y.add_(1)  # a mutation between two equal ops: they must stay apart
    return (z + y.relu() + (x * 2).relu()) @ w


def with_random(x, w):
    return (F.dropout(x, 0.5) + F.dropout(x, 0.5) + torch.rand_like(x) + torch.rand_like(x)) @ w


def aliased_outputs(x, w):
    a = x @ w
    b = x @ w
    return a, b, a.t()  # two outputs of equal value stay two tensors


def layer(x, w, g):
    h = F.layer_norm(x, x.shape[-1:], g)
    return F.softmax(h @ w, -1) * F.softmax(h @ w, -1)


CASES = {
    "repeated": (repeated, lambda: (torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True))),
    "mutation": (with_mutation, lambda: (torch.randn(8, 16, requires_grad=True), torch.randn(16, 4))),
    "random": (with_random, lambda: (torch.randn(8, 16, requires_grad=True), torch.randn(16, 4))),
    "aliased": (aliased_outputs, lambda: (torch.randn(8, 16, requires_grad=True), torch.randn(16, 16))),
    "layer": (
        layer,
        lambda: (torch.randn(4, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True), torch.randn(16)),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_merged_is_functorchs_pass_node_for_node(name):
    from torch._functorch.compile_utils import fx_graph_cse

    fn, make = CASES[name]
    [joint] = joints(fn, *make())
    ours, theirs = joint_cse.merged(joint.graph), fx_graph_cse(joint.graph)
    assert ours.python_code("self").src == theirs.python_code("self").src
    assert len(ours.nodes) <= len(joint.graph.nodes)


def test_repeated_ops_are_merged_and_a_mutation_keeps_them_apart():
    fn, make = CASES["repeated"]
    [joint] = joints(fn, *make())
    ops = (torch.ops.aten.sin.default, torch.ops.aten.cos.default)
    before = [n.target for n in joint.graph.nodes if n.target in ops]  # the forward's and the backward's
    after = [n.target for n in joint_cse.merged(joint.graph).nodes if n.target in ops]
    assert len(before) == 8 and sorted(map(str, after)) == ["aten.cos.default", "aten.sin.default"]
    fn, make = CASES["mutation"]  # functionalized: the in-place add is an add, equal relus merge
    [joint] = joints(fn, *make())
    assert joint_cse.merged(joint.graph).python_code("self").src.count("aten.relu.default") == 2


def test_a_mutating_op_between_two_equal_ops_keeps_them_apart():
    from torch._functorch.compile_utils import fx_graph_cse

    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    first = graph.call_function(torch.ops.aten.relu.default, (x,))
    again = graph.call_function(torch.ops.aten.relu.default, (x,))  # merged with `first`
    graph.call_function(torch.ops.aten.copy_.default, (x, y))  # x written: a new region
    after = graph.call_function(torch.ops.aten.relu.default, (x,))  # not merged with `first`
    later = graph.call_function(torch.ops.aten.relu.default, (x,))  # merged with `after`
    graph.output((first, again, after, later))
    code = joint_cse.merged(graph).python_code("self").src
    assert code.count("aten.relu.default") == 2
    assert code == fx_graph_cse(graph).python_code("self").src


@pytest.mark.slow
def test_a_training_compile_imports_no_inductor_pattern_matcher():
    """minicomp's partition (autograd.py) merges with joint_cse and turns the partition's own pass
    off: a fresh process's training compile never imports torch._inductor.pattern_matcher."""
    code = (
        "import sys, torch, minicomp\n"
        "f = minicomp.jit(lambda x, w: (torch.sin(x) @ w).relu().sum() + (torch.sin(x) @ w).sum())\n"
        "x = torch.randn(8, 16, requires_grad=True)\n"
        "f(x, torch.randn(16, 4)).backward()\n"
        "assert x.grad is not None\n"
        "print('pattern_matcher' if 'torch._inductor.pattern_matcher' in sys.modules else 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "none"
