"""Issue: never a wrong result. One test per way minicomp was found to differ from eager (items 1-16),
per clear-error bullet, and per hole in the cache; each is named after what it guards."""

import functools
import math
import types
import warnings

import numpy as np
import pytest
import torch
from conftest import kernel_count
from torch import nn

import minicomp
from minicomp import guards


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def quietly(fn, *args, **kwargs):
    """Call a jitted function whose signature is expected to run eagerly (it warns why)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# -- 1. modules do not share code ---------------------------------------------------


def test_modules_do_not_share_each_others_code():
    x = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(minicomp.jit(nn.ReLU())(x), torch.relu(x))
    torch.testing.assert_close(minicomp.jit(nn.Sigmoid())(x), torch.sigmoid(x))
    torch.testing.assert_close(minicomp.jit(nn.Tanh())(x), torch.tanh(x))


# -- 2. mode and attributes are guarded ---------------------------------------------


def test_batchnorm_train_then_eval_uses_running_stats_and_leaves_them():
    torch.manual_seed(0)
    bn, ref = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    fn = minicomp.jit(bn)
    x = torch.randn(8, 4)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), ref(x))
    bn.eval(), ref.eval()
    stats = bn.running_mean.clone()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), ref(x))
    torch.testing.assert_close(bn.running_mean, stats)  # eval mode never updates them
    assert bn.num_batches_tracked.item() == 1


def test_dropout_stops_dropping_after_eval():
    drop = nn.Dropout(0.5)
    fn = minicomp.jit(drop)
    x = torch.ones(64)
    assert (fn(x) == 0).any()
    drop.eval()
    torch.testing.assert_close(fn(x), x)


def test_plain_module_attribute_change_recompiles():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = 2.0

        def forward(self, x):
            return x * self.factor

    module = Scale()
    fn = minicomp.jit(module)
    x = torch.randn(5)
    torch.testing.assert_close(fn(x), x * 2)
    module.factor = 3.0
    torch.testing.assert_close(fn(x), x * 3)


def test_forward_that_changes_its_attributes_runs_eagerly():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1

        def forward(self, x):
            self.k += 1
            return x * self.k

    module = Counter()
    fn = minicomp.jit(module, fallback="silent")
    assert [fn(torch.ones(1)).item() for _ in range(3)] == [2.0, 3.0, 4.0]
    assert module.k == 4


def test_forward_hook_added_later_is_seen():
    module = nn.ReLU()
    fn = minicomp.jit(module)
    x = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(fn(x), torch.relu(x))
    module.register_forward_hook(lambda m, args, out: out + 10)
    torch.testing.assert_close(fn(x), torch.relu(x) + 10)


# -- 3. the first call with an input that requires grad runs once --------------------


def test_first_call_with_grad_applies_side_effects_once(device):
    def f(x, w):
        x.mul_(2)
        return x * w

    x = torch.ones(3, device=device)
    w = torch.ones(3, device=device, requires_grad=True)
    out = minicomp.jit(f)(x, w)
    torch.testing.assert_close(x, torch.full((3,), 2.0, device=device))
    out.sum().backward()
    torch.testing.assert_close(w.grad, torch.full((3,), 2.0, device=device))


def test_batchnorm_counts_one_batch_per_training_call():
    bn = nn.BatchNorm1d(4)
    fn = minicomp.jit(bn)
    fn(torch.randn(8, 4, requires_grad=True)).sum().backward()
    assert bn.num_batches_tracked.item() == 1
    fn(torch.randn(8, 4, requires_grad=True))
    assert bn.num_batches_tracked.item() == 2


# -- 4. aliased inputs ----------------------------------------------------------------


def add_then_read(a, b):
    a.add_(1)
    return b * 2


@pytest.mark.parametrize(
    "make",
    [
        lambda x: (x, x),
        lambda x: (x, x[2:6]),
        lambda x: (x[2:6], x),
    ],
)
def test_aliased_inputs_see_the_write(device, make):
    fn = minicomp.jit(add_then_read)
    fn(torch.zeros(8, device=device), torch.zeros(8, device=device))  # compiled for distinct inputs
    x, y = torch.zeros(8, device=device), torch.zeros(8, device=device)
    expected = add_then_read(*make(y))
    torch.testing.assert_close(fn(*make(x)), expected)
    torch.testing.assert_close(x, y)


@pytest.mark.parametrize("grad", [False, True])
def test_inputs_of_two_storages_over_the_same_memory_see_the_write(grad):
    """Two tensors of one numpy array are two storages: memory is shared where their bytes overlap."""
    w = torch.ones(6, requires_grad=grad)

    def f(a, b, w):
        a.add_(1)
        return b * w

    fn = minicomp.jit(f)
    fn(torch.zeros(6), torch.zeros(6), w)  # compiled for distinct inputs (a training one: its first call)
    x, y = np.zeros(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    out = fn(torch.from_numpy(x)[:6], torch.from_numpy(x[2:]), w)
    torch.testing.assert_close(out, f(torch.from_numpy(y)[:6], torch.from_numpy(y[2:]), w))
    np.testing.assert_array_equal(x, y)


def test_aliased_inputs_on_the_first_training_call(device):
    w = torch.ones(4, device=device, requires_grad=True)

    def f(a, b, w):
        a.add_(1)
        return b * w

    x, y = torch.zeros(4, device=device), torch.zeros(4, device=device)
    fn = minicomp.jit(f)
    torch.testing.assert_close(fn(x, x, w), f(y, y, w))
    torch.testing.assert_close(fn(torch.zeros(4, device=device), x, w), x * w)  # later calls compile


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("first", [True, False])
def test_an_input_written_into_that_is_a_closed_over_tensor_sees_the_write(device, grad, first):
    """`f(W)` where f writes into its argument and reads the global `W`: the compiled code read the
    constant before the write, eager after it (a first call, and one after a call without the alias)."""
    table = torch.arange(6.0, device=device)

    def f(x, w):
        x.add_(1)
        return (x + table.sum()) * w

    fn = minicomp.jit(f)
    w = torch.ones(6, device=device, requires_grad=grad)
    if not first:
        fn(torch.zeros(6, device=device), w)
    expected = table + 1
    out = fn(table, w)  # (the same tensor object: the signature's key holds the global by identity)
    torch.testing.assert_close(out, (expected + expected.sum()) * w)
    torch.testing.assert_close(table, expected)
    out = fn(table[2:4], w[:2])  # a view of it: another signature
    expected[2:4] += 1
    torch.testing.assert_close(out, (expected[2:4] + expected.sum()) * w[:2])
    torch.testing.assert_close(table, expected)


# -- 5. the persistent key covers what the function reads (see also test_trust_cache) --


def test_fingerprint_covers_module_attributes_and_bound_self(tmp_path, monkeypatch):
    from minicomp.guards import fingerprint

    helpers = type(math)("trust_helpers")
    helpers.SCALE, helpers.act = 2.0, torch.relu
    monkeypatch.setitem(globals(), "trust_helpers", helpers)

    def f(x):
        return trust_helpers.act(x) * trust_helpers.SCALE  # noqa: F821 - set above

    before = fingerprint.of(f)
    helpers.SCALE = 10.0
    assert fingerprint.of(f) != before
    helpers.SCALE = 2.0
    assert fingerprint.of(f) == before
    helpers.act = torch.sigmoid
    assert fingerprint.of(f) != before

    class Holder:
        def __init__(self, k):
            self.k = k

        def method(self, x):
            return x * self.k

    assert fingerprint.of(Holder(2).method) is None  # an object's state: never persisted


# -- 6, 7. scalars by their bits, numpy arrays by their contents -----------------------


def test_negative_zero_is_not_positive_zero(device):
    fn = minicomp.jit(lambda x, s: x / s)
    x = torch.ones(2, device=device)
    torch.testing.assert_close(fn(x, 0.0), x / 0.0)
    torch.testing.assert_close(fn(x, -0.0), x / -0.0)


def test_nan_scalar_compiles_once():
    fn = minicomp.jit(lambda x, s: x + s)
    for _ in range(3):
        assert torch.isnan(fn(torch.ones(2), float("nan"))).all()
    assert fn.compiles == 1


def test_numpy_arguments_are_keyed_by_their_contents():
    fn = minicomp.jit(lambda x, a: x + torch.from_numpy(a))
    a1 = np.zeros(2000, dtype=np.float32)
    a2 = a1.copy()
    a2[1000] = 5
    x = torch.zeros(2000)
    assert fn(x, a1)[1000].item() == 0.0
    assert fn(x, a2)[1000].item() == 5.0


def test_objects_that_cannot_be_watched_run_eagerly():
    class Config:
        scale = 2.0

    cfg = Config()
    fn = minicomp.jit(lambda x, c: x * c.scale, fallback="warn")
    with pytest.warns(UserWarning, match="minicomp cannot tell when an object changes"):
        torch.testing.assert_close(fn(torch.ones(2), cfg), torch.full((2,), 2.0))
    cfg.scale = 3.0
    torch.testing.assert_close(fn(torch.ones(2), cfg), torch.full((2,), 3.0))


# -- 8. global modes are guarded --------------------------------------------------------


def test_autocast_is_guarded():
    fn = minicomp.jit(lambda a, b: (a @ b).relu())
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", torch.bfloat16):
        assert fn(a, b).dtype == torch.bfloat16
    assert fn(a, b).dtype == torch.float32


def test_default_dtype_is_guarded():
    fn = minicomp.jit(lambda x: x + torch.ones(3))
    assert fn(torch.ones(3, dtype=torch.float64)).dtype == torch.float64
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = fn(torch.ones(3, dtype=torch.float64))
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float64 and fn.compiles == 2


def test_global_state_key_names_what_changed():
    with torch.autocast("cpu", torch.bfloat16):
        inside = guards.global_state()
    assert inside != guards.global_state()
    assert "autocast cpu torch.bfloat16" in guards.describe_state(inside)


# -- 9-12, 14. arithmetic as eager does it ------------------------------------------


def test_negation_keeps_the_sign_of_zero(device):
    a = torch.zeros(4, device=device)
    torch.testing.assert_close(minicomp.jit(lambda a: 1.0 / (-a))(a), 1.0 / (-a))


@pytest.mark.parametrize("op", [torch.fmax, torch.fmin])
def test_fmax_fmin_ignore_a_single_nan(device, op):
    nan = float("nan")
    a = torch.tensor([nan, 2.0, nan, 1.0], device=device)
    b = torch.tensor([1.0, nan, nan, 3.0], device=device)
    torch.testing.assert_close(minicomp.jit(op)(a, b), op(a, b), equal_nan=True)


@pytest.mark.parametrize("step", [2**30, 2**37])
def test_int64_arange_does_not_wrap(device, step):
    def f(x):
        return x + torch.arange(0, 8 * step, step, device=x.device)

    x = torch.zeros(8, dtype=torch.int64, device=device)
    assert torch.equal(minicomp.jit(f, fallback="raise")(x), f(x))


def test_int32_plus_a_huge_python_int_wraps_like_eager(device):
    x = torch.arange(4, dtype=torch.int32, device=device)
    fn = minicomp.jit(lambda x: x + 2**40 + 3, fallback="raise")
    assert torch.equal(fn(x), x + 2**40 + 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "op",
    [
        lambda x: x + 3.3,
        lambda x: x - 0.7,
        lambda x: 1.3 - x,
        lambda x: x * 3.3,
        lambda x: x / 3.3,
        lambda x: torch.add(x, x, alpha=1.7),
    ],
)
def test_16_bit_tensor_and_python_float_match_eager_exactly(device, dtype, op):
    x = torch.randn(256, device=device).to(dtype)
    assert torch.equal(minicomp.jit(op)(x), op(x))


def test_first_run_failure_falls_back_to_eager(monkeypatch):
    from minicomp.dispatch.entries import Entry

    def broken(*args):
        raise RuntimeError("kernel launch failed")

    real = Entry.__init__

    def install_broken(self, call, *args, **kwargs):
        real(self, broken, *args, **kwargs)

    monkeypatch.setattr(Entry, "__init__", install_broken)
    fn = minicomp.jit(lambda x: x * 2, fallback="warn")
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="kernel launch failed"):
        torch.testing.assert_close(fn(x), x * 2)
    torch.testing.assert_close(fn(x), x * 2)  # the signature now runs eagerly, quietly
    strict = minicomp.jit(lambda x: x * 3, fallback="raise")
    for _ in range(2):  # raising remembers nothing: the next call does not run eagerly in silence
        with pytest.raises(minicomp.CompileError, match="kernel launch failed"):
            strict(x)


def test_first_run_failure_through_torch_compile_falls_back_unless_it_writes_an_input(monkeypatch):
    """A kernel that fails at its first launch (a Triton compile error) through the backend: the
    graph runs as Dynamo captured it, by the fallback policy; one that writes into an input may have
    written it already, so it raises a clear error instead of running the call twice."""
    from minicomp.runtime import launch

    def broken(self, *args, **kwargs):
        raise RuntimeError("CompilationError: at 67:4: injected")

    monkeypatch.setattr(launch.Launch, "__call__", broken)
    monkeypatch.setenv("MINICOMP_FALLBACK", "warn")
    torch._dynamo.reset()
    x = torch.randn(8)
    compiled = torch.compile(lambda x: (x * 2).relu(), backend="minicomp")
    with pytest.warns(UserWarning, match="injected"):
        torch.testing.assert_close(compiled(x), (x * 2).relu())
    torch.testing.assert_close(compiled(x), (x * 2).relu())  # the captured graph from now on

    def writes(x):
        x.mul_(2)
        return x + 1

    torch._dynamo.reset()
    y = torch.randn(8)
    with pytest.raises(minicomp.CompileError, match="writes into an input"):
        torch.compile(writes, backend="minicomp")(y.clone())
    torch._dynamo.reset()


# -- 13, 15. outputs: types and aliasing as in eager ---------------------------------


def test_non_tensor_outputs_come_back_as_returned():
    def f(x):
        return x + 1, "x", float("inf"), x.device, x.shape, None, -0.0

    x = torch.ones(2, 3)
    out = minicomp.jit(f, fallback="raise")(x)
    torch.testing.assert_close(out[0], x + 1)
    assert out[1:4] == ("x", math.inf, x.device)
    assert type(out[4]) is torch.Size and out[4] == x.shape
    assert out[5] is None and math.copysign(1, out[6]) < 0


def test_returned_view_aliases_its_input(device):
    x = torch.ones(3, 2, device=device)
    out = minicomp.jit(lambda t: t[0])(x)
    out.fill_(5)
    assert x[0, 0].item() == 5.0
    y = torch.arange(12.0, device=device)[2:]
    view = minicomp.jit(lambda t: t.view(2, 5).t())(y)
    assert view.data_ptr() == y.data_ptr() and view.stride() == y.view(2, 5).t().stride()


def test_mutated_and_returned_input_is_the_input(device):
    x = torch.ones(3, device=device)
    fn = minicomp.jit(lambda t: t.mul_(2))
    assert fn(x) is x and fn(x) is x
    torch.testing.assert_close(x, torch.full((3,), 4.0, device=device))


def test_same_tensor_returned_twice_is_one_object():
    a, b = minicomp.jit(lambda t: (t + 1,) * 2)(torch.ones(2))
    assert a is b


def test_output_structure_survives_the_persistent_cache():
    from torch.utils import _pytree as pytree

    from minicomp.capture import Argument, ArgumentView, Constant, GraphOutput, Outputs, SameAs

    spec = pytree.tree_flatten((0, "x", torch.Size([2]), 0, 0, 0, -0.0), is_leaf=lambda v: isinstance(v, torch.Size))[1]
    records = [
        GraphOutput(0),
        Constant("x"),
        Constant(torch.Size([2])),
        Argument(0),
        SameAs(0),
        ArgumentView(1, (2,), (1,), 3),
        Constant(-0.0),
    ]
    stored = Outputs(spec, records).dumps()
    assert stored["kinds"][:2] == [["tensor", 0], ["const", ["str", "x"]]]  # the format on disk
    assert stored["kinds"][5] == ["view", 1, [2], [1], 3]
    again = Outputs.loads(stored)
    assert again.records[:6] == records[:6] and math.copysign(1, again.records[6].value) < 0
    assert Outputs(spec, [Constant(object())]).dumps() is None  # such an entry is not stored


def test_signature_key_and_output_records_read_by_name():
    x, y = torch.randn(4), torch.randn(3)
    fn = minicomp.jit(lambda a, b: (a + 1, a, a[1:], "s", b))
    result = fn(x, y)
    (key,) = fn.cache
    assert isinstance(key, guards.SignatureKey) and key.structure == 2 and key.context is None
    assert dict(zip(guards.TENSOR_FIELDS, key.leaves[0])) == dict(
        shape=x.shape, stride=(1,), dtype=torch.float32, device=x.device, requires_grad=False
    )
    assert key.modes == guards.global_state()
    assert fn._key([x, y], 2) == key and hash(fn._key([x, y], 2)) == hash(key)  # a call's plain tuple finds it
    outputs = fn.cache[key].outputs
    first, same, view, text, other = outputs.records
    assert first.index == 0 and same.slot == 0 and other.slot == 1 and text.value == "s"
    assert (view.slot, view.shape, view.stride, view.offset) == (0, (3,), (1,), 1)
    assert result[1] is x and result[2]._base is x and result[4] is y
    assert guards.describe_change(key, key._replace(leaves=(key.leaves[0], guards.leaf_key(x))), None) == (
        "argument 1: shape torch.Size([3]) -> torch.Size([4])"
    )


def test_named_tuple_results_compile_and_keep_their_type(device):
    """Regression: `x.max(-1)`, `topk`, `sort` return torch.return_types, which pytree cannot
    write to the persistent index: every such function ran eagerly. It compiles (not stored
    across processes) and returns the same named tuple as eager."""
    x = torch.randn(4, 8, device=device)
    for fn in (lambda t: (t * 2).max(-1), lambda t: torch.topk(t + 1, 3), lambda t: torch.sort(t - 1, dim=0)):
        expected, actual = fn(x), minicomp.jit(fn)(x)
        assert type(actual) is type(expected)
        torch.testing.assert_close(tuple(actual), tuple(expected))
        assert actual.indices.dtype == torch.int64


def test_a_closed_over_tensor_that_requires_grad_gets_its_gradient(device):
    """Regression: a function that closes over a weight that requires grad (a global parameter,
    a module it calls) compiled it as a constant: the output did not require grad and `.grad`
    stayed None. Such a call runs eagerly (with a warning), inference and training alike."""
    w = torch.randn(7, 24, device=device, requires_grad=True)
    lin = nn.Linear(24, 3).to(device)
    for x in (torch.randn(7, 24, device=device), torch.randn(7, 24, device=device, requires_grad=True)):
        for fn, params in ((lambda a: (a * w).sum(), [w]), (lambda a: lin(a).sum(), list(lin.parameters()))):
            for p in params:
                p.grad = None
            out = minicomp.jit(fn, fallback="silent")(x)
            assert out.requires_grad
            out.backward()
            assert all(p.grad is not None for p in params)
            assert torch.allclose(params[0].grad.sum(), torch.autograd.grad(fn(x), params[0])[0].sum())
            with torch.no_grad():  # no gradient wanted: it compiles
                jitted = minicomp.jit(fn)
                torch.testing.assert_close(jitted(x), fn(x))
                assert jitted.compiled(x) is not None


def test_a_closed_over_tensor_unfrozen_after_compiling_gets_its_gradient(device):
    """A weight frozen when the function compiled (`requires_grad=False`, a constant of the
    graph) and unfrozen later: the entry checks it on each call and runs eagerly from then on."""
    w = torch.randn(5, 6, device=device)
    table = torch.randn(5, 6, device=device)  # never requires grad: compiled, in training too
    for x in (torch.randn(5, 6, device=device), torch.randn(5, 6, device=device, requires_grad=True)):
        w.requires_grad_(False)
        fn = minicomp.jit(lambda a: (a * w + table).sum())
        assert not fn(x).requires_grad or x.requires_grad
        assert fn.compiles == 1 and fn.compiled(x) is not None
        w.requires_grad_(True)
        out = fn(x)
        out.backward()
        torch.testing.assert_close(w.grad, x.detach())
        w.grad = None


def test_a_number_read_from_tensor_values_is_not_returned_as_a_symbol():
    """Regression: `return x.sum().item()` returned the trace's symbol (a SymFloat) as a constant
    of the entry, on every call, in place of the number. Such a function runs eagerly."""
    x = torch.randn(4, 6)
    for fn in (lambda a: a.sum().item(), lambda a: (a * 2, a[0].tolist()), lambda a: {"n": int(a.argmax())}):
        jitted = minicomp.jit(fn, fallback="silent")
        torch.testing.assert_close(jitted(x), fn(x))
        assert isinstance(jitted.cache[next(iter(jitted.cache))], minicomp.dispatch.entries.EagerEntry)
    with pytest.raises(minicomp.CompileError, match="reads tensor values in Python"):
        minicomp.jit(lambda a: a.max().item(), fallback="raise")(x)


def test_a_repeated_value_read_by_aten_keeps_its_last_dim_contiguous(device):
    """Regression (H200): SDPA's mask [S, S], padded, sliced and expanded over batch and heads by
    the decomposition, was written with strides (2, 1, 8, 2), the repeated dims innermost; the
    CUDA attention kernel refused a mask whose last dim is not contiguous, and the call ran
    eagerly. The repeated dims now go outermost."""
    from minicomp.ir import TensorMeta
    from minicomp.lowering.layout import output_strides

    meta = TensorMeta((1, 2, 4, 4), (0, 0, 8, 1), torch.float32, torch.device(device))
    assert output_strides(meta)[1:] == (16, 4, 1)  # (dim 0 has one element: its stride is moot)
    q, mask = torch.randn(1, 2, 4, 8, device=device), torch.randn(4, 4, device=device)
    fn = lambda q, m: torch.nn.functional.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=m)  # noqa: E731
    torch.testing.assert_close(minicomp.jit(fn)(q, mask), fn(q, mask))


def test_a_cpu_scalar_in_a_gpu_function(device):
    """Regression (H200): `b[:, 2] = 0.0` on a GPU tensor captures a 0-d CPU tensor and copies it
    (`lift_fresh_copy`); a kernel computed that copy on the GPU into CPU memory, Triton refused
    the pointer and the call ran eagerly. A CPU value of a GPU function is an ATen call. Floats
    converted to uint8 wrap through int64, as eager's cast does (-1.5 -> 255; Triton saturates)."""

    def zero_column(a):
        b = a.clone()
        b[:, 2] = 0.0
        return b

    x = torch.randn(4, 6, device=device)
    torch.testing.assert_close(minicomp.jit(zero_column)(x), zero_column(x))
    scale = torch.tensor(2.5)
    torch.testing.assert_close(minicomp.jit(lambda a, s: a * s + 1)(x, scale), x * scale + 1)
    t = torch.tensor([-1.5, 300.0, 255.9, -0.5, -200.0], device=device)
    assert torch.equal(minicomp.jit(lambda a: (a * 1).to(torch.uint8))(t), t.to(torch.uint8))


# -- 16. partial rotary gradients ---------------------------------------------------


def partial_rope(q, cos, sin):
    r = cos.shape[-1]
    qr, qp = q[..., :r], q[..., r:]
    return torch.cat([qr * cos + rotate_half(qr) * sin, qp], -1)


def test_partial_rotary_gradients_match_eager(device):
    q = torch.randn(2, 4, 11, 64, device=device, requires_grad=True)
    cos, sin = (torch.randn(11, 16, device=device, requires_grad=True) for _ in range(2))
    fn = minicomp.jit(partial_rope)
    out = fn(q, cos, sin)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, cos, sin), seed)
    expected = torch.autograd.grad(partial_rope(q, cos, sin), (q, cos, sin), seed)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    saved = fn.entry(q, cos, sin).backward.graph.inputs
    assert not any(name.startswith("slice") for name in saved), saved  # views are recomputed, not saved


def test_saved_view_keeps_its_strides():
    """A view the forward returns keeps eager's strides (the backward indexes it with them)."""
    fn = minicomp.jit(lambda x: (x * 2)[:, :3])
    out = fn(torch.randn(4, 8))
    assert out.stride() == (8, 1)


# -- clear errors instead of crashes -------------------------------------------------


def test_partial_callable_objects_and_builtins_compile():
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(minicomp.jit(functools.partial(torch.add, alpha=2), fallback="raise")(x, y), x + 2 * y)

    class Affine:
        def __call__(self, t):
            return t * 3 + 1

    torch.testing.assert_close(minicomp.jit(Affine(), fallback="raise")(x), x * 3 + 1)
    fn = minicomp.jit(torch.relu, fallback="raise")
    torch.testing.assert_close(fn(x), torch.relu(x))
    assert kernel_count(fn.source(x)) == 1


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("MINICOMP_CACHE_LIMIT", "0", "MINICOMP_CACHE_LIMIT must be a whole number >= 1, not '0'"),
        ("MINICOMP_CACHE_LIMIT", "abc", "MINICOMP_CACHE_LIMIT must be a whole number >= 1, not 'abc'"),
        ("MINICOMP_RECOMPILE_WARNING", "-3", "MINICOMP_RECOMPILE_WARNING must be a whole number"),
        ("MINICOMP_COMPILE_THREADS", "0", "MINICOMP_COMPILE_THREADS must be a whole number >= 1, not '0'"),
        ("MINICOMP_FALLBACK", "loud", "MINICOMP_FALLBACK must be one of warn, silent, raise, not 'loud'"),
    ],
)
def test_bad_environment_variables_give_one_line_errors(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(minicomp.ConfigError) as info:
        minicomp.jit(lambda x: x + 1)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_import_succeeds_with_a_bad_environment_variable():
    import subprocess
    import sys

    env = dict(__import__("os").environ, MINICOMP_CACHE_LIMIT="abc")
    run = subprocess.run([sys.executable, "-c", "import minicomp"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_tuning_records_are_validated():
    from minicomp.runtime.launch_configs import valid_config

    assert valid_config([512, 4]) == (512, 4)
    for bad in ([0, 4], [500, 4], [512, 3], ["512", 4], [1 << 20, 4], [512]):
        with pytest.raises((ValueError, TypeError)):
            valid_config(bad)


# -- Python values a function reads: checked on every call (reads.py) -----------------

SCALE = 2.0
TABLE = torch.ones(6)
SETTINGS = types.SimpleNamespace(shift=1.0)


def scaled(x):
    return x * SCALE


def calls_a_helper(x):
    return scaled(x) + SETTINGS.shift


def adds_the_table(x):
    return x + TABLE


def test_a_rebound_global_recompiles(device, monkeypatch, caplog):
    """Regression: `SCALE = 3.0` after the first call returned x * 2.0 (globals were constants of
    the trace). Each call now keys the values the function reads: a global, a global of a
    helper it calls, an attribute of a config object, a rebound tensor; and the cache on disk
    is looked up under a fingerprint taken for the new values, not the first ones."""
    x = torch.randn(6, device=device)
    monkeypatch.setitem(globals(), "TABLE", torch.ones(6, device=device))
    fn, helper_fn, table_fn = (minicomp.jit(f) for f in (scaled, calls_a_helper, adds_the_table))
    for f in (fn, helper_fn, table_fn):
        f(x)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    with caplog.at_level("INFO", logger="minicomp.recompiles"):
        torch.testing.assert_close(fn(x), x * 3.0)
    assert "the global 'SCALE' changed" in caplog.text
    torch.testing.assert_close(helper_fn(x), x * 3.0 + 1.0)  # the helper's global
    monkeypatch.setattr(SETTINGS, "shift", -1.0)
    torch.testing.assert_close(helper_fn(x), x * 3.0 - 1.0)  # an attribute of a config object
    monkeypatch.setitem(globals(), "TABLE", torch.full((6,), 5.0, device=device))
    torch.testing.assert_close(table_fn(x), x + 5.0)  # a rebound tensor (an in-place change needs no key)
    assert fn.compiles == 2 and helper_fn.compiles == 3 and table_fn.compiles == 2


def test_a_changed_closure_cell_recompiles(device):
    x = torch.randn(6, device=device)
    factor = 2.0
    fn = minicomp.jit(lambda a: a * factor)
    torch.testing.assert_close(fn(x), x * 2.0)
    factor = 4.0  # noqa: F841 - read through the closure cell
    torch.testing.assert_close(fn(x), x * 4.0)


def test_a_module_reads_rebound_tensor_attributes_and_globals(device, monkeypatch):
    """Regression: a module's plain tensor attribute (a RoPE cache made again for a longer
    sequence) was keyed by the tensor's own attributes, none: the new tensor went unseen. Its
    forward's globals are read on each call as a function's are."""

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = torch.ones(6, device=device)

        def forward(self, x):
            return x * self.cache * SCALE

    module = Rotary()
    fn, x = minicomp.jit(module), torch.randn(6, device=device)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), x * SCALE)
        module.cache = torch.full((6,), 3.0, device=device)
        torch.testing.assert_close(fn(x), x * 3.0 * SCALE)
    monkeypatch.setitem(globals(), "SCALE", -1.0)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), x * -3.0)


def test_a_hook_into_autograd_runs_eagerly(device):
    """Regression: `y.retain_grad()` inside a compiled function left `y.grad` None after
    backward (the graph keeps values, not hooks). retain_grad and register_hook now run eagerly."""

    def retained(x):
        y = x * 2
        y.retain_grad()
        return y, (y * y).sum()

    def hooked(x):
        y = x * 2
        y.register_hook(lambda g: g * 10)
        return (y * y).sum()

    x = torch.randn(5, device=device, requires_grad=True)
    y, loss = quietly(minicomp.jit(retained, fallback="warn"), x)
    loss.backward()
    torch.testing.assert_close(y.grad, 4 * x.detach())
    x.grad = None
    quietly(minicomp.jit(hooked, fallback="warn"), x).backward()
    torch.testing.assert_close(x.grad, 80 * x.detach())
    with pytest.warns(UserWarning, match="retain_grad"):
        minicomp.jit(retained, fallback="warn")(x)


# -- what a trace changes inside a mutable value: undone, then eager --------------------

RECORDED = []
COUNTER = types.SimpleNamespace(calls=0)


def records(x):
    RECORDED.append(x * 2)
    COUNTER.calls += 1
    return x + 1


def test_appending_to_a_global_list_happens_once_per_call_with_real_tensors(device):
    """Regression: the trace appended a fake tensor to a global list and compiled; later calls
    appended nothing (eager: one real tensor a call), and a counter in a config object counted
    traces, not calls. What a trace changes inside a list, dict, set or object that the function
    reads is put back, and the function runs eagerly; after a second such trace it is not
    traced again (`compiles` stops growing)."""
    RECORDED.clear()
    COUNTER.calls = 0
    fn, x = minicomp.jit(records, fallback="silent"), torch.randn(4, device=device)
    for _ in range(4):
        torch.testing.assert_close(fn(x), x + 1)
    assert len(RECORDED) == 4 and all(type(t) is torch.Tensor for t in RECORDED)
    torch.testing.assert_close(RECORDED[-1], x * 2)
    assert COUNTER.calls == 4 and fn.compiles == 2


def test_a_forward_appending_to_its_list_attribute_appends_once_per_call(device):
    """Regression: `self.seen.append(...)` in a forward ran twice a call (the trace's append was
    not undone, then eager appended again) and every call traced anew."""

    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, x):
            self.seen.append(x.shape[0])
            return x * 2

    module = Recorder()
    fn = minicomp.jit(module, fallback="silent")
    for _ in range(3):
        fn(torch.randn(5, device=device))
    assert module.seen == [5, 5, 5]


def test_a_table_made_on_the_first_call_compiles_from_the_second(device):
    """A lazily made attribute (a RoPE table built by the first forward) changes state once: that
    call runs eagerly, the next ones compile."""

    class Lazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = None

        def forward(self, x):
            if self.table is None:
                self.table = torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
            return x * self.table

    module, x = Lazy(), torch.randn(4, device=device)
    fn = minicomp.jit(module, fallback="silent")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fn(x), x * torch.arange(4.0, device=device))
    first, second = fn.compiled.cache.values()
    assert first.compiled is None and second.compiled is not None  # eager once, then compiled


def test_tensors_minicomp_does_not_compile_for_run_eagerly(device):
    """Regression: `.conj().imag` (a lazily negated view) and `.imag` of a conjugated view came out
    with the wrong sign; a tensor subclass came back as a plain Tensor; a
    nested tensor raised a raw RuntimeError. Such arguments run eagerly (and a plain tensor of
    the same shape after them still compiles)."""
    c = torch.randn(4, dtype=torch.complex64, device=device)
    doubled = minicomp.jit(lambda t: t * 2 + 1, fallback="silent")
    torch.testing.assert_close(doubled(c.conj().imag), c.conj().imag * 2 + 1)
    torch.testing.assert_close(doubled(c.imag), c.imag * 2 + 1)
    imag = minicomp.jit(lambda t: t.imag * 2, fallback="silent")
    torch.testing.assert_close(imag(c.conj()), c.conj().imag * 2)

    class Tagged(torch.Tensor):
        pass

    tagged = torch.randn(4, device=device).as_subclass(Tagged)
    assert type(doubled(tagged)) is Tagged
    nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)], device=device)
    torch.testing.assert_close(doubled(nested).to_padded_tensor(0), (nested * 2 + 1).to_padded_tensor(0))
    assert doubled.compiled(c.imag) is not None


def test_functorch_transforms_of_a_jitted_function_run_eagerly(device):
    """Regression: vmap(jit(f)) returned a fake tensor (its wrapped tensors were traced as
    inputs). Inside vmap, grad or jacrev a jitted function runs eagerly."""
    fn = minicomp.jit(lambda t: (t.sin() * 2 + 1).relu(), fallback="silent")
    x = torch.randn(3, 5, device=device)
    expected = (x.sin() * 2 + 1).relu()
    out = torch.func.vmap(fn)(x)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, expected)
    eager_grad = torch.func.grad(lambda t: (t.sin() * 2 + 1).relu().sum())(x)
    torch.testing.assert_close(torch.func.grad(lambda t: fn(t).sum())(x), eager_grad)
    torch.testing.assert_close(fn(x), expected)  # outside a transform: compiled
    assert fn.compiled(x) is not None


def test_writing_into_a_leaf_that_requires_grad_raises_as_in_eager(device):
    """Regression: `t.mul_(2)` on a leaf that requires grad compiled and changed it silently;
    eager raises. It now runs eagerly, which raises, and the tensor is left as it was."""
    x = torch.randn(3, device=device, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        quietly(minicomp.jit(lambda t: t.mul_(2), fallback="warn"), x)
    torch.testing.assert_close(x.detach(), before)
    y = torch.randn(3, device=device)  # an input that needs no grad may be written: compiled
    y0 = y.clone()
    out = minicomp.jit(lambda t, u: t * u.mul_(2))(x, y)
    torch.testing.assert_close(y, 2 * y0)
    torch.testing.assert_close(out, x * 2 * y0)
    assert out.requires_grad


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_float64_to_16_bits_rounds_as_eager(device, low):
    """A float64 value cast to bfloat16 came out as NaN or 0 under Triton's interpreter (the CPU
    path; the H200 was right before the fix too). Eager rounds through float32 (c10's 16-bit
    types are made from a float): the first two values round differently if rounded once. (The
    others keep the sum exact in float32 in any order: a reduction's order is not what is tested.)"""
    x = torch.tensor([[1 + 2**-8 + 2**-40, 1 + 2**-11 + 2**-40, -3.25, 0.25, 7.0, -0.375, 2.5e3, 0.0]], device=device)
    x = x.to(torch.float64).expand(4, 8).contiguous()
    pointwise = lambda x: (x * 1.0).to(low) + 0  # noqa: E731
    summed = lambda x: (x * 2).to(low).float().sum(-1)  # noqa: E731
    for fn in (pointwise, summed):
        torch.testing.assert_close(minicomp.jit(fn)(x), fn(x), atol=0, rtol=0)
