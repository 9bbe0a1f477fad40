"""One module's questions to meta kernels answered once each (codegen/meta_answers.py): what makes
two questions the same, and a model of repeated layers generating the same module with fewer meta
kernel calls."""

from __future__ import annotations

import torch

import minicomp
from minicomp.codegen import meta_answers, view_layouts
from minicomp.codegen.meta_answers import Answers, question
from minicomp.ir import Ref, TensorMeta

aten = torch.ops.aten
CPU = torch.device("cpu")


def _meta_of(**metas):
    return metas.get


def test_values_are_asked_by_layout_and_other_arguments_by_type_and_value():
    meta_of = _meta_of(
        a=TensorMeta((4, 8), (8, 1), torch.float32, CPU),
        b=TensorMeta((4, 8), (8, 1), torch.float32, CPU),
        t=TensorMeta((4, 8), (1, 4), torch.float32, CPU),
    )
    ask = lambda *parts: question(*parts, meta_of=meta_of)  # noqa: E731
    assert ask(aten.view.default, Ref("a"), [2, 16]) == ask(aten.view.default, Ref("b"), [2, 16])
    assert ask(aten.view.default, Ref("a"), [2, 16]) != ask(aten.view.default, Ref("t"), [2, 16])
    assert ask(aten.view.default, Ref("a"), [2, 16]) != ask(aten.view.default, Ref("a"), (2, 16))
    assert len({ask(aten.select.int, Ref("a"), 0, v) for v in (1, True, 1.0)}) == 3
    assert ask(aten.clamp.default, Ref("a"), -0.0) != ask(aten.clamp.default, Ref("a"), 0.0)
    nan = float("nan")
    assert ask(aten.clamp.default, Ref("a"), nan) == ask(aten.clamp.default, Ref("a"), float("nan"))
    assert ask(aten.sum.dim_IntList, Ref("a"), [1], {"keepdim": True}) is not None
    assert ask("k", {"b": 1, "a": 2}) == ask("k", {"a": 2, "b": 1})
    # not plain data: a value without a layout, a tensor constant, something unhashable
    assert ask(aten.view.default, Ref("nowhere"), [2, 16]) is None
    assert ask(aten.add.Tensor, Ref("a"), torch.ones(8)) is None
    assert ask(aten.view.default, Ref("a"), [{1, 2}]) is None


def test_an_answer_is_computed_once_per_question_and_each_time_without_one():
    answers, calls = Answers(), []

    def compute():
        calls.append(1)
        return len(calls)

    assert [answers.of(("q",), compute) for _ in range(3)] == [1, 1, 1]
    assert answers.of(("r",), compute) == 2
    assert [answers.of(None, compute) for _ in range(2)] == [3, 4]
    assert (answers.asked, answers.computed) == (6, 4)


def _layers(x, *ws):
    # identical layers: an ATen matmul, then views of its result (made from its buffer by
    # `reinterpret` where the meta kernel says so) and pointwise work
    for w in ws:
        y = torch.addmm(x[0], x, w)
        heads = y.view(4, 2, 4).transpose(0, 1)
        x = (heads.reshape(8, 4) * 0.5).relu().reshape(4, 8)
    return x


def test_a_repeated_layer_asks_no_meta_kernel_again_and_the_module_is_the_same(monkeypatch):
    x, *ws = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)
    made = []
    init = Answers.__init__

    def counted(self):
        init(self)
        made.append(self)

    monkeypatch.setattr(Answers, "__init__", counted)
    counts = []
    for layers in (2, 3):
        made.clear()
        jitted = minicomp.jit(_layers)
        torch.testing.assert_close(jitted(x, *ws[:layers]), _layers(x, *ws[:layers]))
        counts.append((sum(a.asked for a in made), sum(a.computed for a in made)))
    (asked_2, computed_2), (asked_3, computed_3) = counts
    assert asked_3 > asked_2 and computed_3 == computed_2 < asked_2  # the third layer's were the second's
    for module in (meta_answers, view_layouts):  # every question asked anew: the same module
        monkeypatch.setattr(module, "question", lambda *parts, meta_of: None)
    made.clear()
    assert minicomp.jit(_layers).source(x, *ws) == jitted.source(x, *ws)
    assert sum(a.computed for a in made) == sum(a.asked for a in made) == asked_3  # (generated again)
