"""Saved activations handed to the backward at the forward's strides (dispatch/saved_layouts.py):
a padded matmul's product sliced to its columns is saved as that view, not copied out."""

from __future__ import annotations

import time
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import grads_match

import minicomp
from minicomp import config
from minicomp.dispatch import saved_layouts
from minicomp.dispatch.dynamo import registered

aten = torch.ops.aten


@pytest.fixture
def always():
    with config.override(pad_matmuls="always"):
        yield


def _loss(y):
    return lambda h, w: F.cross_entropy((h @ w.t()).float(), y)


def test_saved_product_is_the_padded_view(device, always):
    # the logits [6, 37] are saved for the backward: as the view of the [6, 40] product, no kernel
    # writes a copy of them, and the backward reads them at the row stride 40
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)
    y = torch.randint(0, 37, (6,), device=device)
    entry = grads_match(_loss(y), h, w)
    assert "= reinterpret(mm_padded, (6, 37), (40, 1), 0)" in entry.forward.source  # the slice: a view
    assert "float32[6, 37] stride (40, 1)" in entry.backward.source


def test_through_the_backend(device, always):
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)
    y = torch.randint(0, 37, (6,), device=device)
    eager = [t.clone().requires_grad_() for t in (h, w)]
    mine = [t.clone().requires_grad_() for t in (h, w)]
    compiled = torch.compile(_loss(y), backend=registered())
    for _ in range(2):  # the second call too: the saved view of a fresh product
        for t in mine:
            t.grad = None
        compiled(*mine).backward()
    _loss(y)(*eager).backward()
    for a, b in zip(mine, eager):
        torch.testing.assert_close(a.grad, b.grad)


def test_an_input_that_arrives_dense_is_conformed():
    # the forward run eagerly after a fallback hands the backward eager's dense value
    seen = []

    def backward(args):
        seen.append(args[0].stride())
        return [args[0] * 2]

    run = saved_layouts.conformed(backward, [(0, (2, 3), (4, 1))])
    x = torch.arange(6.0).view(2, 3)
    (out,) = run([x])
    assert seen == [(4, 1)]
    torch.testing.assert_close(out, x * 2)
    assert saved_layouts.conformed(backward, []) is backward


def _graphs(backward_op, returned_too: bool = False, width: int = 3):
    """A forward saving a @ b (and returning it too), and a backward reading it through `backward_op`."""
    fake = torch._subclasses.fake_tensor.FakeTensorMode()
    with fake:
        a, b, product = torch.empty(2, 4), torch.empty(4, width), torch.empty(2, width)
    forward = torch.fx.Graph()
    x, y = forward.placeholder("a"), forward.placeholder("b")
    mm = forward.call_function(aten.mm.default, (x, y))
    forward.output((mm, mm) if returned_too else (mm,))
    backward = torch.fx.Graph()
    saved, tangent = backward.placeholder(mm.name), backward.placeholder("tangents_1")
    saved.meta["val"], tangent.meta["val"] = product, product
    read = backward.call_function(backward_op, (saved, [-1]) if backward_op is aten.view.default else (saved, tangent))
    backward.output((read,))
    del a, b
    return torch.fx.GraphModule({}, forward), torch.fx.GraphModule({}, backward)


@pytest.mark.parametrize(
    "backward_op, returned_too, width, marked",
    [
        (aten.mul.Tensor, False, 3, True),
        (aten.mul.Tensor, True, 3, False),  # returned to the caller too: eager's layout
        (aten.view.default, False, 3, False),  # flattened: eager could not view a row-padded product so
        (aten.mul.Tensor, False, 4, False),  # 16-byte rows: never padded, not probed
    ],
)
def test_saved_products_the_backward_alone_reads_row_padded_are_marked(backward_op, returned_too, width, marked):
    forward, backward = _graphs(backward_op, returned_too, width)
    saved_layouts.mark(forward, backward)
    assert saved_layouts.any_layout(forward) == ({"mm_default"} if marked else frozenset())
    assert backward.graph.find_nodes(op="placeholder")[0].meta["val"].stride() == (width, 1)  # the traced meta kept


def _backward_viewing(shape):
    def backward(saved, tangent):
        return (saved.view(shape) * tangent.view(shape),)

    gm = torch.fx.experimental.proxy_tensor.make_fx(backward, tracing_mode="fake")(torch.randn(2, 3), torch.randn(6))
    gm.graph.find_nodes(op="placeholder")[0].name = "saved"
    return gm


def test_a_layout_the_backward_cannot_view_is_copied_into_the_traced_one():
    # the backward flattens the saved [2, 3] value: eager cannot view it so at row stride 4
    gm = _backward_viewing((-1,))
    assert saved_layouts.laid_out(gm, {"saved": ((2, 3), (4, 1))}) == [(0, (2, 3), (3, 1))]
    assert gm.graph.find_nodes(op="placeholder")[0].meta["val"].stride() == (3, 1)


def test_views_after_a_row_padded_input_take_its_strides():
    gm = _backward_viewing((2, 1, 3))
    assert saved_layouts.laid_out(gm, {"saved": ((2, 3), (4, 1))}) == [(0, (2, 3), (4, 1))]
    view = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    assert view.meta["val"].stride() == (4, 3, 1)


def test_the_wrapper_keeps_no_reference_to_an_input():
    # the boxed backward frees each saved input at its last use: a reference the wrapper kept held
    # GPT-2's padded logits (393 MiB) through the whole backward on the H200
    freed = []

    def backward(args):
        ref = weakref.ref(args[0])
        args.clear()
        freed.append(ref() is None)
        return []

    saved_layouts.conformed(backward, [(0, (2, 3), (3, 1))])([torch.randn(2, 3)])
    assert freed == [True]


def test_a_computed_value_is_written_inside_its_padded_buffer(device, always):
    # the logits' gradient (a reduction kernel's output: a row sum first) is written into the
    # interior of the padded buffer both gradient matmuls read: no copy kernel, no second buffer
    # (plan/padded_writes.py)
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)
    y = torch.randint(0, 37, (6,), device=device)
    entry = grads_match(_loss(y), h, w)
    assert "# inside " in entry.backward.source and ".zero_()  # the padding" in entry.backward.source


def test_a_reshaped_value_is_written_inside_its_padded_buffer(device, always):
    # [2, 3, 37] logits flattened for the loss: the gradient's [2, 3, 37] store is written inside
    # the padded [6, 40] buffer, rows 40 apart
    h, w = torch.randn(2, 3, 16, device=device), torch.randn(37, 16, device=device)
    y = torch.randint(0, 37, (6,), device=device)
    entry = grads_match(lambda h, w: F.cross_entropy(F.linear(h, w).flatten(0, 1), y), h, w)
    assert "# inside " in entry.backward.source


def test_a_bias_gradient_reading_the_padded_value(device, always):
    # the bias gradient, a column sum of the logits' gradient, reads it through views inlined in
    # its kernel, at the strides of the padded buffer it is written inside (its column sums are
    # right, and BERT's step holds one [4096, 30522] gradient instead of two)
    h, w, b = (torch.randn(2, 3, 16, device=device), torch.randn(37, 16, device=device), torch.randn(37, device=device))
    y = torch.randint(0, 37, (6,), device=device)
    entry = grads_match(lambda h, w, b: F.cross_entropy(F.linear(h, w, b).flatten(0, 1), y), h, w, b)
    assert "# inside " in entry.backward.source


def test_a_value_the_call_keeps_is_not_written_inside_its_padded_buffer(device, always):
    # the softmax is saved for the backward and returned transposed: a value kept past the call
    # keeps its traced layout, so it is not written inside the padded operand of `g @ w`
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)

    def f(h, w):
        g = torch.tanh(h @ w.t()).softmax(1)
        return g @ w, g.t()

    entry = grads_match(f, h, w)
    assert "# inside " not in entry.forward.source


def test_the_values_used_are_found_in_one_walk(device, always):
    # a padded kernel output with 28 diamonds after it (each value read by two ops that meet
    # again): the plan walked every path from it, 2**28 of them (BERT's plan took 14 s)
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)

    def f(h, w):
        x = torch.softmax(h @ w.t(), 1) @ w
        for _ in range(28):
            x = torch.sin(x) + torch.cos(x)
        return x

    start = time.perf_counter()
    source = minicomp.jit(f).source(h, w)
    assert time.perf_counter() - start < 30
    assert "# inside " in source
    torch.testing.assert_close(minicomp.jit(f)(h, w), f(h, w))


def test_a_layout_propagates_to_the_nodes_it_changes_as_through_the_whole_graph():
    # `_propagated` runs again only the nodes whose inputs came out laid out otherwise (a new
    # length of a dynamic graph pays it); every node's meta is then what running the whole graph
    # on fake tensors gives
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from minicomp.dispatch import saved_layouts

    def backward_like(logits, grad, w):
        d = (logits.softmax(-1) - grad).view(2, 3, 37)[:, 1:]
        return (d.reshape(-1, 37) @ w).sum(0), d.sum(-1), grad.t() @ logits

    mode = FakeTensorMode()
    with mode:
        args = (torch.empty(6, 37), torch.empty(6, 37), torch.empty(37, 5))
    gm = make_fx(backward_like, tracing_mode="fake")(*args)
    name = next(n.name for n in gm.graph.nodes if n.op == "placeholder")
    layouts = {name: ((6, 37), (40, 1))}  # the logits at a padded row stride
    pruned, whole = copy.deepcopy(gm), copy.deepcopy(gm)
    assert saved_layouts._propagated(pruned, layouts, keep=True)
    with mode:
        inputs = [n.meta["val"] for n in whole.graph.nodes if n.op == "placeholder"]
        inputs[0] = torch.empty_strided((6, 37), (40, 1))
    FakeTensorProp(whole, mode).propagate_dont_convert_inputs(*inputs)

    def layouts_of(g):
        return [
            (n.name, tuple(n.meta["val"].shape), n.meta["val"].stride())
            for n in g.graph.nodes
            if isinstance(n.meta.get("val"), torch.Tensor)
        ]

    assert layouts_of(pruned) == layouts_of(whole)
    assert layouts_of(pruned) != layouts_of(gm)  # (the layout reached some nodes)
