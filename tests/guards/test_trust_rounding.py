"""16-bit values are compared as eager stores them: rounded to their dtype.

Found by the differential fuzzer (tests/fuzz): the backward of `sin(x).amin(-1)` in bfloat16
recomputes sin in float32 and compares it with the stored, rounded amin; no element was equal,
the count was 0 and every gradient NaN.
"""

import pytest
import torch
from conftest import check, tolerance

import minicomp

LOW = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("reduce", ["amin", "amax"])
def test_gradient_of_an_extremum_of_a_computed_value(device, dtype, reduce):
    """Against eager in the same dtype: ties are decided on the rounded values, so a float32
    reference would disagree wherever rounding makes two elements equal."""
    x = torch.randn(6, 33, device=device, dtype=dtype)
    fn = lambda x: getattr(torch.sin(x), reduce)(dim=-1)  # noqa: E731
    grads = []
    for f in (fn, minicomp.jit(fn)):
        leaf = x.detach().requires_grad_(True)
        f(leaf).float().sum().backward()
        grads.append(leaf.grad)
    assert not grads[1].isnan().any()
    torch.testing.assert_close(grads[1], grads[0], **tolerance(dtype))


@pytest.mark.parametrize("dtype", LOW)
def test_comparisons_of_computed_values_round_first(device, dtype):
    a = torch.randn(257, device=device, dtype=dtype)
    b = a.clone()
    check(lambda a, b: (torch.sin(a) * 3 == torch.sin(b) * 3, torch.exp(a) <= torch.exp(b), torch.tanh(a) > a), a, b)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("to", [torch.int32, torch.int64, torch.uint8])
def test_casts_of_computed_values_to_integers_truncate_the_stored_value(device, dtype, to):
    """`sin(x).to(int)` in 16 bits: eager truncates the rounded sin (0.9999 -> 1.0 -> 1), float32
    would truncate to 0 (found by the fuzzer: views case 8565)."""
    x = torch.linspace(1.2, 1.9, 4096, device=device).to(dtype)
    fn = lambda x: ((torch.sin(x) * 4).to(to), (x * 3.3).to(to))  # noqa: E731
    for got, want in zip(minicomp.jit(fn)(x), fn(x)):
        assert torch.equal(got, want), (got != want).sum()  # exactly: a float32 reference would not do


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("wide", [torch.float32, torch.float64])
def test_a_wider_0d_operand_is_rounded_to_the_common_dtype_first(device, dtype, wide):
    """Long-run fuzz case 61481: `maximum(bf16 x, float32 0-d s)` compares in bfloat16, eager
    rounding s first; compared in float32, an x equal to the rounded s was no tie, and its
    gradient came out 1 where eager's is 0.5."""
    x = torch.randn(4, 33, device=device, dtype=dtype)
    s = torch.tensor(-1.0411838293075562, device=device, dtype=wide)
    x[0, :5] = s.to(dtype)  # equal to s in `dtype` only
    check(lambda x, s: (x == s, x >= s, x < s), x, s)
    grads = []
    for f in (torch.maximum, minicomp.jit(torch.maximum)):
        leaf = x.detach().requires_grad_(True)
        f(leaf, s).float().sum().backward()
        grads.append(leaf.grad)
    assert grads[0][0, :5].eq(0.5).all()
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("train", [False, True])
def test_arithmetic_with_a_0d_operand_of_another_16_bit_dtype_rounds_it_first(device, train):
    """Long-run fuzz case 69963: `where(s > 0, s, x) - s` with s a float16 0-d and x bfloat16 is 0
    in eager (s rounded to bfloat16 on both sides); minicomp subtracted the stored, rounded copy
    and the unrounded s, so sqrt(|.|)'s gradient was finite where eager's is nan."""
    s = torch.tensor(0.294189453125, device=device, dtype=torch.float16)
    x = torch.randn(3, 4, device=device, dtype=torch.bfloat16)

    def fn(s, x):
        t = torch.where(s > 0, s, x)
        return -2 * torch.sqrt(torch.abs(t - s)), t

    if not train:
        check(fn, s, x)
        return
    grads = []
    for f in (fn, minicomp.jit(fn)):
        leaf = s.detach().requires_grad_(True)
        out, t = f(leaf, x)
        (out.float().sum() + t.float().sum()).backward()
        grads.append(leaf.grad)
    assert grads[0].isnan() and grads[1].isnan()


def _normed_over_amax(x, w):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return y / y.abs().amax(-1, keepdim=True)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("through", ["jit", "dynamo"])
def test_a_saved_16_bit_value_is_rounded_where_the_forward_uses_it(device, dtype, through):
    """The forward saved rsqrt (stored rounded) and took amax over y computed from it unrounded; the
    backward recomputed y from the rounded rsqrt, and its comparison with the saved amax matched
    nowhere: NaN gradients (the review of session 21). A saved value is rounded wherever the
    forward computes it (`compile_graph(saved=...)`)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 16, generator=g).to(device, dtype), torch.randn(16, generator=g).to(device, dtype)
    compiled = (
        minicomp.jit(_normed_over_amax) if through == "jit" else torch.compile(_normed_over_amax, backend="minicomp")
    )
    grads = []
    for f in (_normed_over_amax, compiled):
        leaves = [t.detach().requires_grad_(True) for t in (x, w)]
        f(*leaves).float().sum().backward()
        grads.append([t.grad for t in leaves])
    for mine, eager in zip(grads[1], grads[0]):
        assert mine.isfinite().all()
        torch.testing.assert_close(mine.float(), eager.float(), atol=0.1, rtol=0.05)


def _scaled_then_shifted(x, b):
    v = x + b
    v = v / v.abs().amax(-1, keepdim=True)
    return v - v.amin(-1, keepdim=True)


def _embedded_stream_over_amax(tok, emb, w3, w4):
    h = emb[tok]
    h = h + h @ w3 @ w4
    v = h.float()
    return v / v.abs().amax((-2, -1), keepdim=True)


@pytest.mark.parametrize("seed", range(3))
def test_a_16_bit_reduction_is_rounded_where_it_is_computed(device, seed):
    """The forward divided by its amax unrounded and stored the quotient for the amin, whose backward
    recomputed the quotient from the stored, rounded amax: no element matched, NaN gradients (the
    differential hunt of session 21). A 16-bit reduction's result is rounded where it is computed."""
    g = torch.Generator().manual_seed(seed)
    x, b = torch.randn(4, 8, generator=g).bfloat16(), torch.randn(8, generator=g).bfloat16()
    tok, emb = torch.randint(0, 5, (3, 5), generator=g), torch.randn(5, 6, generator=g).bfloat16()
    w3, w4 = torch.randn(6, 12, generator=g).bfloat16(), torch.randn(12, 6, generator=g).bfloat16()
    for fn, args in ((_scaled_then_shifted, [x, b]), (_embedded_stream_over_amax, [tok, emb, w3, w4])):
        leaves = [a.to(device).requires_grad_(a.is_floating_point()) for a in args]
        minicomp.jit(fn)(*leaves).float().sum().backward()
        assert all(bool(a.grad.isfinite().all()) for a in leaves if a.requires_grad), fn.__name__


def _softmax_then_amax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)).amax(-1)


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_a_16_bit_sum_taken_online_with_its_max_is_rounded_too(device, looped):
    """A bf16 softmax written out: looped, its max and sum are accumulated together (online); the
    max was rounded where computed, the sum not, and the backward recomputing the quotient from the
    stored sum matched no element of its amax (NaN gradients; the review of session 21)."""
    x = (torch.randn(4, 40, generator=torch.Generator().manual_seed(1)) * 2).bfloat16().to(device)
    settings = dict(persistent_rows=8, loop_block=16) if looped else {}
    leaf = x.clone().requires_grad_()
    with minicomp.config.override(**settings):
        minicomp.jit(_softmax_then_amax)(leaf).sum().backward()
    assert not leaf.grad.isnan().any()


def _added_then_normed(x, a, w):
    v = x + a  # saved for the norm's backward
    return torch.nn.functional.layer_norm(v, v.shape[-1:], w) * 3


@pytest.mark.parametrize("dtype", LOW)
def test_a_saved_16_bit_value_no_selection_reads_keeps_float32_in_the_forward(device, dtype):
    """The training forward computes the norm from the float32 sum, as its inference graph does and
    as Inductor's forward does; only values a selection reduction (amax, amin, max, min) is computed
    from are rounded where computed (the tests above). Before: every saved 16-bit value was, and
    the training forward was further from float32 than Inductor's (BERT's embeddings 0.00153
    against 0.00112 mean error, docs/experiments.md)."""
    g = torch.Generator().manual_seed(0)
    x, a = (torch.randn(16, 64, generator=g).to(device, dtype) for _ in range(2))
    w = torch.randn(64, generator=g).to(device, dtype)
    inferred = minicomp.jit(_added_then_normed)(x, a, w)
    leaves = [t.detach().requires_grad_(True) for t in (x, a, w)]
    jitted = minicomp.jit(_added_then_normed)
    trained = jitted(*leaves)
    assert torch.equal(trained, inferred)
    assert not jitted.entry(*leaves).forward.plan.rounded
    trained.float().sum().backward()
    eager, exact = ([t.detach().to(d).requires_grad_(True) for t in (x, a, w)] for d in (dtype, torch.float64))
    for leaves_ in (eager, exact):
        _added_then_normed(*leaves_).float().sum().backward()
    for mine, theirs, truth in zip(leaves, eager, exact):  # as close to float64 as eager's, or closer
        mine_error, eager_error = ((t.grad.double() - truth.grad).abs().mean() for t in (mine, theirs))
        assert mine_error <= 1.25 * eager_error, (mine_error, eager_error)


def _normed(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize(
    "select",
    [
        lambda y: torch.max(y),  # an ATen call, not a reduction kernel
        lambda y: torch.median(y),
        lambda y: torch.lgamma(y.abs() + 1).amax(-1),  # an ATen call the backward recomputes before the amax
    ],
    ids=["max", "median", "amax_after_lgamma"],
)
@pytest.mark.parametrize("through", ["jit", "dynamo"])
def test_a_saved_value_a_selection_is_computed_from_through_aten_calls_is_rounded(select, through):
    """Found by the review of recompute.compared: its first version started only from amax/amin
    reduction kernels and stopped at every ATen call, so the saved rsqrt kept float32 in the
    forward while the backward recomputed the value from its rounded copy and compared it with
    the saved max: no element matched, NaN gradients (seed 1 in bfloat16)."""
    fn = lambda x, w: select(_normed(x, w))  # noqa: E731
    compiled = minicomp.jit(fn) if through == "jit" else torch.compile(fn, backend="minicomp")
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 16, generator=g).bfloat16(), torch.randn(16, generator=g).bfloat16()
    leaves = [t.requires_grad_() for t in (x, w)]
    compiled(*leaves).float().sum().backward()
    assert all(bool(t.grad.isfinite().all()) for t in leaves)


def test_a_saved_value_dist_of_inf_order_is_computed_from_is_rounded():
    """The second review of recompute.compared: torch.dist(y, z, p=inf) is a max too (NaN gradients
    at seed 1 in bfloat16 before `dist` joined SELECTIONS)."""
    fn = lambda x, w, z: torch.dist(_normed(x, w), z, p=float("inf"))  # noqa: E731
    g = torch.Generator().manual_seed(1)
    leaves = [t.bfloat16().requires_grad_() for t in (torch.randn(8, 16, generator=g), torch.randn(16, generator=g))]
    leaves.append(torch.randn(8, 16, generator=g).bfloat16().requires_grad_())
    minicomp.jit(fn)(*leaves).float().backward()
    assert all(bool(t.grad.isfinite().all()) for t in leaves)


@pytest.mark.parametrize("through", ["jit", "dynamo"])
def test_a_value_the_backward_computes_again_for_a_logsumexp_is_rounded_in_both_graphs(through):
    """`logsumexp(a * b * 10)` in bfloat16: the backward computes `a * b * 10` again from a and b
    (not saved) and takes exp(x - the saved logsumexp). Both graphs held x in float32, while the
    saved logsumexp was rounded from the float32 x's: at 34.4 a bfloat16 step is 0.25, and one
    row's gradient came out 12% off (a's largest error against float64 3.6 where eager's is 0.12;
    Inductor's is 3.6 too). Now the forward rounds x as eager does (the value the backward computes
    again, in the cone of a selection) and tells its backward to (`Compiled.rounded_values`)."""
    fn = lambda a, b: torch.logsumexp(a * b * 10, -1)  # noqa: E731
    compiled = minicomp.jit(fn) if through == "jit" else torch.compile(fn, backend="minicomp")
    torch.manual_seed(4)
    a, b = torch.randn(4, 9, dtype=torch.bfloat16), torch.randn(4, 9, dtype=torch.bfloat16)
    g = torch.randn(4, dtype=torch.bfloat16)
    grads = {}
    for key, f, dtype in (("float64", fn, torch.float64), ("eager", fn, None), ("minicomp", compiled, None)):
        leaves = [t.to(dtype or t.dtype).detach().requires_grad_() for t in (a, b)]
        f(*leaves).backward(g.to(dtype or g.dtype))
        grads[key] = [t.grad.double() for t in leaves]
    for ours, eager, exact in zip(grads["minicomp"], grads["eager"], grads["float64"]):
        assert (ours - exact).abs().max() <= (eager - exact).abs().max() * 1.05
    torch._dynamo.reset()


@pytest.mark.parametrize("retrace", [False, True], ids=["substituted", "retraced"])
def test_a_dynamic_graphs_sizes_round_by_name_only_where_the_names_are_its_own(monkeypatch, retrace):
    """Found by the review of the names passed between the graphs: a size of a dynamic graph traced
    again (specialize.retraced: an input laid out unlike the graph's) names its nodes anew, and
    `mul_3`, the dynamic forward's `a * b * 10`, was a gradient's product in the retraced backward
    (a's error against float64 4.9, against 3.6 before the names were passed and eager's 0.12).
    A retraced size now gets no names; a substituted one keeps the dynamic graph's."""
    from minicomp.capture import specialize
    from minicomp.dispatch import dynamo

    if retrace:

        def not_substitutable(gm, args, restrided=frozenset()):
            raise specialize.NotSubstitutable("forced by the test")

        monkeypatch.setattr(specialize, "substituted", not_substitutable)
    given, compile_graph = [], dynamo.compile_graph

    def recording(gm, name, *args, **kwargs):
        given.append((kwargs.get("recomputed", frozenset()), kwargs.get("rounded", frozenset())))
        return compile_graph(gm, name, *args, **kwargs)

    monkeypatch.setattr(dynamo, "compile_graph", recording)
    torch._dynamo.reset()
    fn = lambda a, b: torch.logsumexp(a * b * 10, -1)  # noqa: E731
    compiled = torch.compile(fn, backend="minicomp", dynamic=True)
    torch.manual_seed(4)
    leaves = [torch.randn(4, 9, dtype=torch.bfloat16).requires_grad_() for _ in range(2)]
    compiled(*leaves).backward(torch.randn(4, dtype=torch.bfloat16))
    assert all(bool(t.grad.isfinite().all()) for t in leaves)
    (forward_names, _), (_, backward_names) = given
    if retrace:
        assert not forward_names and not backward_names
    else:
        assert forward_names and backward_names
    torch._dynamo.reset()
