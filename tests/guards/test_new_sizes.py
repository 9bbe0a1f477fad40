"""Compile cost that stays flat (issue #42): a new size of a dynamic graph is made concrete by
substitution, not traced again (capture/specialize.py), and kernels alike but for their names
share one `Launch` in a module (codegen/alike.py), so identical layers compile and tune once."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import minicomp
from minicomp.capture import specialize
from minicomp.codegen import alike


def _attention_like(x, w):
    """Sizes of x's dim 1 in views, a softmax over it, a slice of half of it, a mean over it."""
    b, s, d = x.shape
    h = (x @ w).view(b, s, 2, d // 2).transpose(1, 2)
    scores = torch.softmax(h @ h.transpose(-1, -2) / s, dim=-1)
    out = (scores @ h).transpose(1, 2).reshape(b, s, d)
    return F.gelu(out[:, : s // 2 + 1]).mean(1) + out.mean(1)


def test_new_lengths_are_substituted_not_traced_again(device, monkeypatch):
    """After the first two lengths, each new length (one of 1, one that changes divisibility by
    16, odd and even ones) compiles without a trace (`specialize.retraced` is never called), and
    forward and backward equal eager's."""
    from minicomp.dispatch import dynamo

    traced, compiled = [], []
    real_retraced, real_compile = specialize.retraced, dynamo.compile_graph
    monkeypatch.setattr(specialize, "retraced", lambda *a: traced.append(1) or real_retraced(*a))
    monkeypatch.setattr(dynamo, "compile_graph", lambda *a, **k: compiled.append(1) or real_compile(*a, **k))
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    fn = torch.compile(_attention_like, backend=minicomp.dispatch.dynamo.backend)
    for length in (3, 5, 7, 16, 1, 6, 7):
        before = len(compiled)
        x = torch.randn(2, length, 8, device=device, requires_grad=True)
        out = fn(x, w)
        expected = _attention_like(x, w)
        torch.testing.assert_close(out, expected)
        seed = torch.randn_like(out)
        grads = torch.autograd.grad(out, (x, w), seed)
        torch.testing.assert_close(grads, torch.autograd.grad(expected, (x, w), seed))
        if length in (7, 16, 6) and before:
            assert len(compiled) - before in (0, 2)  # the forward and the backward of a new size, or none
    assert not traced
    assert compiled  # (the backend compiled something: the count above is not vacuous)


def test_substituted_graph_is_the_traced_one():
    """On a graph traced with symbolic sizes, the substituted graph runs as the function does and
    has the ops, shapes and strides of the graph a trace on those values records; an input laid
    out unlike the graph's (a transposed one) is traced again instead."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, n: int):
        y = x.reshape(x.shape[0] * x.shape[1]).cumsum(0).view(x.shape[1], x.shape[0])
        return y.t() * n + torch.arange(x.shape[1], dtype=x.dtype), torch.ones(x.shape[0] + 1)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 4), 2)
    x = torch.randn(5, 7)
    static, positions = specialize.substituted(gm, [x, 3])
    assert positions == [0]
    for got, want in zip(static(x), f(x, 3)):
        torch.testing.assert_close(got, want)

    def described(g):
        return [
            (n.target, tuple(n.meta["val"].shape), n.meta["val"].stride())
            for n in g.graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
        ]

    assert described(static) == described(specialize.retraced(gm, [x, 3])[0])

    def g(x):
        return x.cumsum(0) * x.shape[1]

    gm = make_fx(g, tracing_mode="symbolic")(torch.randn(3, 4))
    transposed = torch.randn(7, 5).t()
    try:
        specialize.substituted(gm, [transposed])
    except specialize.NotSubstitutable:
        pass
    else:
        raise AssertionError("a transposed input was substituted")
    again, _ = specialize.concrete(gm, [transposed])
    torch.testing.assert_close(again(transposed), g(transposed))


def test_a_restrided_input_is_substituted_at_the_graphs_layout():
    """An input named `restrided` (a backward's saved value its forward laid out otherwise) is
    compared by shape alone and gets the graph's own layout in the static graph: the compile lays
    it out, and conforms the call's value (dispatch/sized_contracts.py). Its strides bind no size."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def g(x):
        return x.cumsum(0) * x.shape[1]

    gm = make_fx(g, tracing_mode="symbolic")(torch.randn(3, 4))
    name = next(n.name for n in gm.graph.nodes if n.op == "placeholder")
    padded = torch.randn(7, 8)[:, :5]  # [7, 5] at row stride 8
    static, _ = specialize.substituted(gm, [padded], frozenset({name}))
    placeholder = next(n for n in static.graph.nodes if n.op == "placeholder")
    assert tuple(placeholder.meta["val"].shape) == (7, 5) and placeholder.meta["val"].stride() == (5, 1)
    torch.testing.assert_close(static(padded.contiguous()), g(padded))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm = torch.nn.Linear(16, 16), torch.nn.RMSNorm(16)

    def forward(self, x):
        return x + self.up(F.gelu(self.norm(x)))


def test_a_substituted_graph_writes_its_python_code_at_its_first_run(monkeypatch):
    """minicomp reads a static graph's nodes; its Python code (half a substitution's time) is
    generated only where it runs, as the fallback's captured graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return (x * 2).sum(0)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 4))
    written = []
    python_code = torch.fx.Graph.python_code
    monkeypatch.setattr(
        torch.fx.Graph, "python_code", lambda self, *a, **k: written.append(1) or python_code(self, *a, **k)
    )
    x = torch.randn(5, 4)
    static, _ = specialize.substituted(gm, [x])
    assert not written
    torch.testing.assert_close(static(x), f(x))
    assert written


def test_identical_layers_compile_once(device):
    """Identical blocks' kernels share one Launch per distinct kernel: six blocks have as many
    as four (the first and last blocks' kernels differ from the middle ones'), forward and
    backward, and the results are eager's."""
    from minicomp.dispatch import dynamo

    distinct = {}
    real = dynamo.compile_graph
    for blocks in (4, 6):
        compiled = []
        dynamo.compile_graph = lambda *a, **k: compiled.append(real(*a, **k)) or compiled[-1]
        try:
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[_Block() for _ in range(blocks)]).to(device)
            x = torch.randn(3, 16, device=device, requires_grad=True)
            out = torch.compile(model, backend=minicomp.dispatch.dynamo.backend)(x)
            torch.testing.assert_close(out, model(x))
            out.sum().backward()
            grads = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            model(x).sum().backward()
            torch.testing.assert_close(grads, [p.grad for p in model.parameters()])
        finally:
            dynamo.compile_graph = real
        launches = [c.launch(k) for c in compiled for k in c.kernels]
        distinct[blocks] = len({id(la) for la in launches})
        assert len(launches) > distinct[blocks]  # (blocks' kernels were alike: some share)
        assert any("but for its names" in c.source for c in compiled)
    assert distinct[6] == distinct[4]


_KERNEL = """
@triton.jit
def mc_fused_add_{i}(x{i}_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x{i} = tl.load(x{i}_ptr + offsets, mask=offsets < n_elements)
    add_{i} = {op}(x{i}, {c})
    tl.store(out_ptr + offsets, add_{i}, mask=offsets < n_elements)


launch_{i} = Launch(mc_fused_add_{i}, PointwiseLaunch(numel={numel}), device="cpu")
"""


def test_alike_keys_ignore_only_the_kernels_own_names():
    """Kernels equal but for what they name themselves have one key; a different global called,
    constant, launch spec or keyword-passed parameter makes another."""

    def key(i=0, op="_sum", c="1.0", numel=64):
        return alike.key(_KERNEL.format(i=i, op=op, c=c, numel=numel))

    assert key(0) == key(7)
    assert key(0) != key(0, op="_max")
    assert key(0) != key(0, c="2.0")
    assert key(0) != key(0, numel=128)
    assert alike.key(_KERNEL.format(i=0, op="_sum", c="1.0", numel=64).replace("BLOCK_SIZE", "XBLOCK")) != key(0)
    assert alike.key("def (") is None


def test_a_module_parses_a_kernel_only_where_an_earlier_one_may_be_alike(monkeypatch):
    """Alike (codegen/alike.py) keys a kernel only once an earlier one of its launch signature has
    its text with every identifier blanked; it binds as `key` alone would."""
    keyed = []
    real = alike.key
    monkeypatch.setattr(alike, "key", lambda text: keyed.append(text) or real(text))

    def text(i=0, op="_sum", c="1.0", numel=64):
        return _KERNEL.format(i=i, op=op, c=c, numel=numel)

    module, signature = alike.Alike(), ((torch.float32,), (64,))
    assert module.first(text(0), signature, "launch_0") == "launch_0"
    assert module.first(text(1, op="_max"), signature, "launch_1") == "launch_1"  # blanked alike, key differs
    assert module.first(text(2, c="2.0"), signature, "launch_2") == "launch_2"
    assert module.first(text(3, numel=128), signature, "launch_3") == "launch_3"
    assert len(keyed) == 2  # launch_0 and launch_1 blank alike; another constant or numel does not
    assert module.first(text(4), signature, "launch_4") == "launch_0"
    assert module.first(text(5, op="_max"), signature, "launch_5") == "launch_1"
    assert len(keyed) == 4
    assert module.first(text(6), ((torch.float16,), (64,)), "launch_6") == "launch_6"  # another signature


def _gelu_mm_gelu(x, y):
    m = torch.mm(F.gelu(x), x)
    return F.gelu(torch.mm(y, m.to(y.dtype)))


def test_alike_kernels_of_other_dtypes_keep_their_own_launch(device):
    """A Launch binds one binary for one signature: gelu of a float32 value and gelu of a float64
    value are one text (one alike key) but two launches; both of float32 share one."""
    import re

    for dtype, shared in ((torch.float32, True), (torch.float64, False)):
        x, y = torch.randn(4, 4, device=device), torch.randn(4, 4, device=device, dtype=dtype)
        fn = minicomp.jit(_gelu_mm_gelu)
        # (float32 tolerances for both: the float64 product's operand m is computed in float32)
        torch.testing.assert_close(fn(x, y), _gelu_mm_gelu(x, y), rtol=1.3e-6, atol=1e-5)
        compiled = fn.entry(x, y).compiled
        launches = [compiled.launch(k) for k in compiled.kernels]
        assert launches[0] is launches[-1] if shared else launches[0] is not launches[-1]
        if not shared:
            texts = re.split(r"\n(?=# kernel \d+:)", compiled.source[: compiled.source.index("def call")])[1:]
            assert alike.key(texts[0]) == alike.key(texts[-1])  # (the text alone would have shared them)


def _input_views(x):
    """Views of x whose sizes are symbolic at a second length: a flat slice (offset 1) and a select
    (offset 2, stride 4), with a computed output beside them."""
    n = x.shape[0]
    return x.view(n * x.shape[1])[1:], x.view(n, 2, 2)[:, 1], x.sum()


def test_outputs_viewing_an_input_at_new_lengths(device):
    """AOTAutograd makes an output that views an input again from the caller's input, at the
    compiled output's layout where its views had symbolic sizes: the compiled graph returns it as
    that view (it came back at offset 0, every element shifted, from the second length on)."""
    torch._dynamo.reset()
    fn = torch.compile(_input_views, backend=minicomp.dispatch.dynamo.backend)
    for length in (3, 5, 8):
        x = torch.randn(length + 1, 4, device=device)[1:]  # (an input at an offset of its own)
        got = fn(x)
        torch.testing.assert_close(got, _input_views(x))
        assert got[0].data_ptr() == x.data_ptr() + 4  # a view, as eager's


def test_a_length_of_one_after_others_with_a_sliced_leaf(device):
    """A leaf that is a slice of wider rows at length 1 after two other lengths: Dynamo's forward
    is dynamic in the size-1 dimension's stride while its backward is static, and that backward
    was given the forward's symbolic stride as its gradient's layout (a crash in codegen,
    reported as a data-dependent shape)."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x * 2, backend=minicomp.dispatch.dynamo.backend)
    for length in (3, 5, 1):
        x = torch.randn(length, 6, device=device)[:, :3].requires_grad_()
        seed = torch.randn(length, 3, device=device)
        (fn(x) * seed).sum().backward()
        torch.testing.assert_close(x.grad, seed * 2)


def _doubled_view(x):
    x.mul_(2)
    return x.view(x.shape[0] * x.shape[1])[1:]


def test_an_output_viewing_an_input_written_in_place_at_new_lengths(device):
    """The view of an input the graph writes into (its `copy_` of the doubled value) is that view
    of the input, as the graph's plain input views are (it came back shifted from the second
    length on)."""
    torch._dynamo.reset()
    fn = torch.compile(_doubled_view, backend=minicomp.dispatch.dynamo.backend)
    for length in (3, 5, 8):
        x = torch.randn(length, 4, device=device)
        expected = x.clone()
        got, want = fn(x), _doubled_view(expected)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, expected)


def test_a_new_sizes_kernel_that_fails_at_its_first_launch_falls_back(monkeypatch):
    """A size of a dynamic graph is a module of its own: a kernel failing at its first launch (a
    Triton error) runs that size's graph as captured, by the fallback policy, as a static graph's
    first call does (guarded_calls.checked_first_call), not raised past the policy."""
    from minicomp.dispatch import dynamo
    from minicomp.runtime import launch

    def fn(x):
        return (x * 2).relu().sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=dynamo.backend)
    for rows in (4, 5):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), fn(x))

    def broken(self, *args):
        raise RuntimeError("CompilationError: injected")

    monkeypatch.setattr(launch.Launch, "__call__", broken)
    monkeypatch.setenv("MINICOMP_FALLBACK", "silent")
    for _ in range(2):
        x = torch.randn(7, 8)
        torch.testing.assert_close(compiled(x), fn(x))
    torch._dynamo.reset()


def test_a_call_like_the_last_one_reuses_its_entry_and_any_other_is_keyed():
    """`Specializing` checks a call against the last call's signature first (`call_signatures.LastCall`): the same
    sizes run the same compiled entry; another size, another storage offset, another integer
    value, a transposed input each take the keyed way (their own entry, built once)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, n: int):
        return x.cumsum(0) * n

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 4), 2)
    built = []

    def compile_static(static, names):
        built.append(tuple(n.meta["val"].shape for n in static.graph.nodes if n.op == "placeholder"))
        return lambda tensors: [static(*tensors)]

    run = specialize.Specializing(gm, compile_static, fail=lambda err: (_ for _ in ()).throw(err))
    base = torch.randn(6, 4)
    calls = [
        (torch.randn(3, 4), 2),
        (torch.randn(3, 4), 2),  # the last call's signature: no build
        (torch.randn(5, 4), 2),  # another size
        (base[1:4], 2),  # an offset of 4: another signature than (3, 4) at offset 0
        (torch.randn(3, 4), 3),  # another value of n (an integer input of the graph)
        (torch.randn(3, 4), 2),  # (3, 4) again: its entry, keyed
    ]
    for x, n in calls:
        (got,) = run([x, n])
        torch.testing.assert_close(got, f(x, n))
    assert len(built) == 4 and built[0] == built[2]  # (3, 4), (5, 4), the offset's (3, 4), n = 3: one each
