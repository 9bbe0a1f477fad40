"""Which Python function a generated `call` runs each ATen op through (codegen/aten_bindings.py):
torch's own binding where it cannot pick another overload and returns what the overload returns,
else the OpOverload's `_op`; and the generated code's results through both against eager."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

import minicomp
from minicomp.codegen import aten_bindings
from minicomp.ir import Ref, TensorMeta

aten = torch.ops.aten


def _metas(**shapes):
    metas = {
        name: TensorMeta(shape, torch.empty(shape).stride(), torch.float32, torch.device("cpu"))
        for name, shape in shapes.items()
    }
    return metas.get


def test_a_call_no_other_overload_takes_goes_through_torchs_binding():
    meta_of = _metas(x=(1, 2, 5, 5), w=(3, 2, 3, 3), a=(4, 5), b=(5, 6))
    conv = (Ref("x"), Ref("w"), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    bound = aten_bindings.binding(aten.convolution.default, conv, {}, meta_of)
    assert bound == "torch._C._VariableFunctions.convolution"
    # mm.dtype takes a third argument: two cannot reach it
    assert aten_bindings.binding(aten.mm.default, (Ref("a"), Ref("b")), {}, meta_of) == "torch._C._VariableFunctions.mm"
    pool = (Ref("x"), [2, 2], [2, 2])
    assert aten_bindings.binding(aten.max_pool2d_with_indices.default, pool, {}, meta_of) == (
        "torch._C._nn.max_pool2d_with_indices"
    )


def test_a_call_another_overload_could_take_keeps_the_op():
    meta_of = _metas(a=(4, 5), b=(4, 5))
    assert aten_bindings.binding(aten.add.Tensor, (Ref("a"), Ref("b")), {}, meta_of) is None  # add.Scalar: 2 too
    assert aten_bindings.binding(aten.add_.Tensor, (Ref("a"), Ref("b")), {}, meta_of) is None  # mutable
    # a value without a meta layout (a symbolic size, a local the graph does not name)
    assert aten_bindings.binding(aten.mm.default, (Ref("a"), Ref("c")), {}, meta_of) is None
    # a factory's device is not a meta call's
    full = ([2, 3], 1.0)
    kwargs = {"dtype": torch.float32, "device": torch.device("cpu"), "pin_memory": False}
    assert aten_bindings.binding(aten.full.default, full, kwargs, meta_of) is None


def test_a_binding_refusing_the_arguments_keeps_the_op():
    """The binding is called on meta tensors first: where it raises or returns another layout, `_op`."""
    meta_of = _metas(a=(4, 5), b=(6, 7))  # mm of mismatched sizes: both refuse
    assert aten_bindings.binding(aten.mm.default, (Ref("a"), Ref("b")), {}, meta_of) is None


def test_generated_calls_through_bindings_match_eager_and_no_mode_sees_them_again():
    """A convolution, a matmul and a pooling through torch's bindings give eager's values; a
    TorchFunctionMode active around the jitted call does not see the ATen ops of its `call`."""

    def f(x, w, m):
        y = torch.nn.functional.conv2d(x, w, padding=1).relu()
        y = torch.nn.functional.max_pool2d(y, 2)
        return y.flatten(1) @ m

    x, w, m = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(64, 5)
    jitted = minicomp.jit(f, fallback="raise")
    torch.testing.assert_close(jitted(x, w, m), f(x, w, m))
    source = jitted.entry(x, w, m).compiled.source
    assert "torch._C._VariableFunctions.convolution(" in source and "torch._C._VariableFunctions.mm(" in source

    seen = []

    class Counting(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Counting():
        first = jitted(x, w, m)  # (traced again under the mode: its key holds the mode stack)
        seen.clear()
        second = jitted(x, w, m)
    torch.testing.assert_close(first, f(x, w, m))
    torch.testing.assert_close(second, f(x, w, m))
    assert not [s for s in seen if "conv" in str(s) or "mm" in str(s) or "matmul" in str(s)], seen


def test_an_overload_takes_a_call_by_count_and_names():
    """`_takes`: positional arguments within its range, keywords among its arguments past them (a
    positional-or-keyword argument given by name counts), every argument without a default given."""
    dim_list = aten.sum.dim_IntList._schema  # (Tensor self, int[1]? dim, bool keepdim=False, *, dtype=None)
    assert aten_bindings._takes(dim_list, 1, ("dim",))
    assert aten_bindings._takes(dim_list, 3, ("dtype",))
    assert not aten_bindings._takes(dim_list, 1, ())  # dim has no default
    assert not aten_bindings._takes(dim_list, 2, ("self",))  # self is given positionally
    assert not aten_bindings._takes(dim_list, 4, ())
    assert aten_bindings._module(aten.div.Tensor, 2, ()) is None  # div.Scalar takes two as well


def test_a_factory_keeps_the_op_and_is_not_run_at_codegen():
    """A call that reads no value (randn of a size) or names a device would run its probe for real:
    it keeps `_op`, and the global random stream does not move (the review's reproducer)."""
    state = torch.get_rng_state()
    assert aten_bindings.binding(aten.randn.default, ([3, 4],), {}, {}.get) is None
    assert aten_bindings.binding(aten.randperm.default, (5,), {}, {}.get) is None
    assert torch.equal(state, torch.get_rng_state())
    meta_of = _metas(a=(4, 5))
    assert aten_bindings.binding(aten.ones_like.default, (Ref("a"),), {"device": torch.device("cpu")}, meta_of) is None
