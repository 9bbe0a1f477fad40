"""Scatter kernels (issue #38, item 2): `index_put` with accumulate (an embedding's gradient,
index_add) and `scatter_add` as one Triton kernel of atomic adds each, its values' producers
fused into it, instead of ATen's sort-based `index_put` (lowering/ops/scatters.py,
plan/scatter.py, codegen/scatter.py). Against eager on random inputs with duplicate indexes,
through `minicomp.jit` (forward and training) and `torch.compile(backend="minicomp")`; where
atomics cannot serve (deterministic algorithms, bfloat16 in Triton's interpreter, int64) the
ATen call stays."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import aten_call, check, grads_match, kernel_count

import minicomp
import minicomp.dispatch.dynamo

DTYPES = [torch.float32, torch.float16]
EXTERN = "index_put"  # an ATen index_put (conftest.aten_call)


def _kinds(compiled) -> list[str]:
    return [k.kind for k in compiled.kernels]


def _indices(n: int, size: int, shape, device) -> torch.Tensor:
    """Random indexes in [0, size) with duplicates and the largest index present."""
    i = torch.randint(0, size, shape, device=device)
    i.view(-1)[0], i.view(-1)[-1] = size - 1, i.view(-1)[1]  # the max index, and a duplicate
    return i


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6,), (3, 5)], ids=["1d", "2d"])
def test_embedding_backward_is_one_scatter_kernel(device, dtype, shape):
    w = torch.randn(11, 8, dtype=dtype, device=device)
    idx = _indices(6, 11, shape, device)
    entry = grads_match(lambda w, idx: F.embedding(idx, w).tanh(), w, idx)
    backward = entry.backward
    assert not aten_call(backward.source, EXTERN)
    # a 16-bit table's gradient is summed in float32 (the decomposition's), then rounded by a second kernel
    assert _kinds(backward) == ["scatter"] + ["pointwise"] * (dtype != torch.float32), backward.source
    assert "tl.atomic_add(" in backward.source and "tanh" in backward.source  # the values computed inline


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_with_padding_idx(device, dtype):
    w = torch.randn(9, 4, dtype=dtype, device=device)
    idx = torch.tensor([[3, 1, 3, 8], [0, 3, 8, 8]], device=device)
    entry = grads_match(lambda w, idx: F.embedding(idx, w, padding_idx=3) * 2, w, idx)
    assert _kinds(entry.backward)[0] == "scatter" and not aten_call(entry.backward.source, EXTERN)
    # the padding rows' zeros are not added at all (codegen/scatter.py `_zero_where`)
    assert "mask=mask & (" in entry.backward.source


@pytest.mark.parametrize("kept", ["taken", "other"])
def test_values_where_zero_add_only_the_rest(device, kept):
    i, v = _indices(6, 5, (6,), device), torch.randn(6, 4, device=device)
    m = torch.tensor([True, False, True, True, False, False], device=device)[:, None]

    def fn(i, v, m):
        values = torch.where(m, v, 0.0) if kept == "taken" else torch.where(m, 0.0, v * 2)
        return torch.zeros(5, 4, device=v.device).index_put((i,), values, accumulate=True)

    source = check(fn, i, v, m, kernels=1)
    assert "mask=mask & (" in source and not aten_call(source, EXTERN)


def test_in_place_index_put_of_an_input(device):
    def fn(x, i, v):
        x.index_put_((i,), v * 2, accumulate=True)
        return x + 1

    x, v = torch.randn(10, 4, device=device), torch.randn(6, 4, device=device)
    assert not aten_call(check(fn, x, _indices(6, 10, (6,), device), v), EXTERN)  # x afterwards compared too


def test_tied_embeddings_add_two_scatters(device):
    w = torch.randn(7, 4, device=device)
    a, b = _indices(5, 7, (5,), device), _indices(3, 7, (3,), device)
    entry = grads_match(lambda w, a, b: F.embedding(a, w).sin() + F.embedding(b, w)[:1], w, a, b)
    assert not aten_call(entry.backward.source, EXTERN)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put_one_index_starts_from_a_copy_of_the_input(device, dtype):
    x = torch.randn(10, 4, dtype=dtype, device=device)
    i = torch.tensor([0, 9, 3, 3, 0, -1, -10], device=device)  # duplicates, negatives counted from the end
    v = torch.randn(7, 4, dtype=dtype, device=device)
    source = check(lambda x, i, v: torch.index_put(x, (i,), v.exp(), accumulate=True), x, i, v, kernels=1)
    assert not aten_call(source, EXTERN) and ".copy_(x)" in source  # x is the caller's: never added into


def test_index_put_two_indices_and_broadcast_values(device):
    x = torch.randn(5, 6, 3, device=device)
    i0, i1 = torch.tensor([[0], [4], [0]], device=device), torch.tensor([[5, 5, 1, -6]], device=device)
    v = torch.randn(4, 3, device=device)  # broadcast to [3, 4, 3]
    source = check(lambda x, a, b, v: torch.index_put(x * 2, (a, b), v + 1, accumulate=True), x, i0, i1, v, kernels=2)
    assert not aten_call(source, EXTERN)


@pytest.mark.parametrize(
    "where, values",
    [((None, 0, 1), (3, 1, 4, 2)), ((0, None, 1), (3, 4, 5, 2)), ((None, None, 1), (4, 1))],
    ids=["adjacent", "apart", "last"],
)
def test_index_put_with_none_takes_its_dim_whole(device, where, values):
    """x[:, i, j] (the indexed dims adjacent: their broadcast shape in their place), x[i, :, j]
    (apart: it goes first), x[:, :, j]."""
    x = torch.randn(3, 5, 6, 2, device=device)
    i, j = torch.tensor([[0], [2], [2]], device=device), torch.tensor([1, 5, 5, -1], device=device)
    v = torch.randn(values, device=device)

    def fn(x, i, j, v):
        return torch.ops.aten.index_put(x, [None if k is None else (i, j)[k] for k in where], v.cos(), True)

    assert not aten_call(check(fn, x, i, j, v, kernels=1), EXTERN)


def test_dlrm_interaction_backward_is_scatter_kernels(device):
    """The seed talk's DLRM in small: a table per sparse feature (their zero gradients share one
    `full`), the pairwise dots selected by `triu_indices` (whose gradient is an index_put with a
    None: x[:, rows, cols])."""
    tables = [torch.randn(7, 4, device=device) for _ in range(3)]
    dense, sparse = torch.randn(5, 4, device=device), torch.randint(0, 7, (5, 3), device=device)
    pairs = torch.triu_indices(4, 4, 1, device=device)

    def fn(dense, t0, t1, t2, sparse):
        vectors = torch.stack([dense, *(F.embedding(sparse[:, k], t) for k, t in enumerate((t0, t1, t2)))], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, pairs[0], pairs[1]]
        return torch.cat([dense, dots], 1).tanh()

    entry = grads_match(fn, dense, *tables, sparse)
    assert not aten_call(entry.backward.source, EXTERN)
    assert _kinds(entry.backward).count("scatter") == 4, str(entry.backward.plan)


@pytest.mark.parametrize("values", [(4,), (6, 1), ()], ids=["row", "column", "scalar-tensor"])
def test_index_put_trailing_dims_broadcast(device, values):
    x = torch.zeros(10, 4, device=device)
    i = _indices(6, 10, (6,), device)
    v = torch.randn(values, device=device)
    source = check(lambda x, i, v: x.index_put((i,), v * 3, accumulate=True), x, i, v, kernels=1)
    assert not aten_call(source, EXTERN)


def test_index_add_and_scatter_add(device):
    x, src = torch.randn(10, 4, device=device), torch.randn(6, 4, device=device)
    i = _indices(6, 10, (6,), device)
    assert not aten_call(check(lambda x, i, s: x.index_add(0, i, s.relu(), alpha=2.0), x, i, src, kernels=1), EXTERN)
    idx = torch.randint(0, 3, (6, 3), device=device)  # smaller than src along dim 1
    # x.t() is copied by a kernel, then into the output (a view of `self` is not yet copied by ATen)
    source = check(lambda x, i, s: x.t().scatter_add(1, i, s.t() * 2).t(), x, idx.t(), src, kernels=3)
    assert "tl.atomic_add(" in source and "scatter_add.default" not in source.split('"""')[-1]


def test_an_output_of_one_element(device):
    x, i, s = torch.randn(1, device=device), torch.tensor([0, 0, 0], device=device), torch.randn(3, device=device)
    assert not aten_call(check(lambda x, i, s: x.index_add(0, i, s, alpha=2), x, i, s, kernels=1), EXTERN)


def test_values_of_a_reduction_scatter_in_a_later_stage(device):
    x, i = torch.randn(6, 5, device=device), _indices(6, 4, (6,), device)
    fn = lambda x, i: torch.zeros(4, 5, device=x.device).index_put((i,), x.softmax(-1), accumulate=True)  # noqa: E731
    compiled = minicomp.jit(fn)
    torch.testing.assert_close(compiled(x, i), fn(x, i))
    assert _kinds(compiled.compiled(x, i)) == ["reduction", "scatter"]


def test_a_scatter_result_read_by_a_kernel(device):
    w, i = torch.randn(8, 4, device=device, requires_grad=True), _indices(5, 8, (5,), device)
    # the gradient of w reaches a pointwise kernel (the mul by 3) after the scatter
    entry = grads_match(lambda w, i: F.embedding(i, w * 3).sum(-1), w, i)
    assert _kinds(entry.backward)[:1] == ["scatter"]


def test_training_through_torch_compile(device, monkeypatch):
    compiled = []

    def spy(gm, name, **kwargs):
        compiled.append(minicomp.pipeline.compile_graph(gm, name, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(minicomp.dispatch.dynamo, "compile_graph", spy)
    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(13, 8).to(device), torch.nn.Linear(8, 3).to(device)
    idx = _indices(10, 13, (2, 5), device)
    # squared: a plain `.sum()` of the Linear's output fails today without any scatter (the backward's
    # ATen permute of the expanded tangent: ExternMismatch), reported apart
    fn = lambda idx: (lin(emb(idx).relu()) ** 2).sum()  # noqa: E731
    fn(idx).backward()
    want = emb.weight.grad.clone()
    emb.weight.grad = None
    torch.compile(fn, backend=minicomp.dispatch.dynamo.backend)(idx).backward()
    torch.testing.assert_close(emb.weight.grad, want)
    backward = compiled[-1]
    assert "scatter" in _kinds(backward) and not aten_call(backward.source, EXTERN)


def test_deterministic_algorithms_keep_aten(device):
    x, i, v = torch.randn(10, 4, device=device), _indices(6, 10, (6,), device), torch.randn(6, 4, device=device)
    fn = lambda x, i, v: x.index_put((i,), v, accumulate=True)  # noqa: E731
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        source = check(fn, x, i, v)
        compiled = minicomp.jit(fn)
        torch.testing.assert_close(compiled(x, i, v), fn(x, i, v))
    finally:
        torch.use_deterministic_algorithms(was)
    assert aten_call(source, EXTERN) and "atomic_add" not in source
    # the same function called without them compiles again (the key holds the flag): a kernel
    torch.testing.assert_close(compiled(x, i, v), fn(x, i, v))
    assert not aten_call(compiled.source(x, i, v), EXTERN)
    torch.use_deterministic_algorithms(True)
    try:
        assert aten_call(compiled.source(x, i, v), EXTERN)
    finally:
        torch.use_deterministic_algorithms(was)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64])
def test_dtypes_without_atomics_keep_aten(dtype):
    # bfloat16: Triton's interpreter has no bfloat16 atomics (a GPU before sm90 none either); int64: none anywhere
    x = torch.randn(10, 4).to(dtype)
    i, v = _indices(6, 10, (6,), "cpu"), torch.randn(6, 4).to(dtype)
    source = check(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, i, v)
    assert aten_call(source, EXTERN)


def test_int32_accumulates_in_a_kernel():
    x, v = torch.randint(-5, 5, (10, 4), dtype=torch.int32), torch.randint(-5, 5, (6, 4), dtype=torch.int32)
    source = check(lambda x, i, v: x.index_put((i,), v * 2, accumulate=True), x, _indices(6, 10, (6,), "cpu"), v)
    assert not aten_call(source, EXTERN)


@pytest.mark.parametrize("bad", [10, -11, 2**32 + 1])
def test_index_out_of_bounds_raises(bad):
    x, v = torch.randn(10, 4), torch.randn(3, 4)
    fn = lambda x, i, v: x.index_put((i,), v * 2, accumulate=True)  # noqa: E731
    compiled = minicomp.jit(fn)
    good = torch.tensor([0, 9, -10])
    torch.testing.assert_close(compiled(x, good, v), fn(x, good, v))
    with pytest.raises(IndexError):
        fn(x, torch.tensor([0, bad, 1]), v)
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([0, bad, 1]), v)
    scatter = lambda x, i, v: x.scatter_add(0, i, v)  # noqa: E731
    with pytest.raises(RuntimeError):
        minicomp.jit(scatter)(x, torch.tensor([[0, 1, -1, 2]]), v[:1])  # scatter_add does not count from the end


def test_plan_text_says_how_the_output_starts():
    fn = minicomp.jit(lambda x, i, v: x.index_put((i,), v, accumulate=True))
    plan = str(fn.compiled(torch.randn(10, 4), torch.tensor([1, 1]), torch.randn(2, 4)).plan)
    assert "scatter over [2, 4] into a buffer starting as x" in plan
    w = torch.randn(6, 3, requires_grad=True)
    g = minicomp.jit(lambda w, i: F.embedding(i, w).sum())
    g(w, torch.tensor([1, 1, 5])).backward()
    assert "scatter over [3, 3] into a buffer filled with 0" in str(g.entry(w, torch.tensor([1, 1, 5])).backward.plan)
    assert kernel_count(g.entry(w, torch.tensor([1, 1, 5])).backward.source) == 1


def _unique(n: int, size: int, device) -> torch.Tensor:
    """n distinct indexes in [0, size), some negative (counted from the end, as eager does)."""
    i = torch.randperm(size, device=device)[:n]
    i[0] = i[0] - size
    return i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_store_without_accumulate_is_a_scatter_kernel(device, dtype):
    """`x[i] = f(v)`: stores, not atomics, so any dtype (bfloat16, int64, bool: none of them has
    atomic adds here) is one kernel, its values computed inline."""
    x = torch.randn(10, 4, device=device).to(dtype)
    v = torch.randn(5, 4, device=device).to(dtype)
    i = _unique(5, 10, device)
    fn = lambda x, i, v: torch.index_put(x, (i,), (v * 2) if dtype != torch.bool else ~v)  # noqa: E731
    source = check(fn, x, i, v, kernels=1)
    assert not aten_call(source, EXTERN) and "tl.store(out_ptr" in source and "atomic_add" not in source


def test_a_store_through_none_dims_and_broadcast_values(device):
    """`x[:, i] = v` (a None takes its dim whole) with values broadcast over the rows, and a
    2-index `x[a, b] = v`."""
    x = torch.randn(3, 8, 5, device=device)
    i = _unique(4, 8, device)

    def columns(x, i, v):
        x[:, i] = v.exp()
        return x * 1.0

    source = check(columns, x, i, torch.randn(4, 5, device=device))
    assert not aten_call(source, EXTERN) and "tl.store(out_ptr" in source
    a, b = torch.tensor([0, 2, 1], device=device), torch.tensor([7, -1, 3], device=device)
    check(lambda x, a, b, v: x.index_put((a, b), v + 1), x, a, b, torch.randn(3, 5, device=device), kernels=1)


def test_duplicate_stores_keep_one_of_their_values(device):
    """Which duplicate wins is unspecified (as in eager): each written row holds one of its values."""
    x, v = torch.zeros(6, 3, device=device), torch.arange(12.0, device=device).view(4, 3) + 1
    i = torch.tensor([2, 5, 2, 2], device=device)
    out = minicomp.jit(lambda x, i, v: x.index_put((i,), v), fallback="raise")(x, i, v)
    assert torch.equal(out[5], v[1]) and any(torch.equal(out[2], v[k]) for k in (0, 2, 3))
    assert out[[0, 1, 3, 4]].eq(0).all()


def test_a_store_out_of_bounds_raises():
    compiled = minicomp.jit(lambda x, i, v: x.index_put((i,), v * 2))
    x, v = torch.randn(10, 4), torch.randn(2, 4)
    torch.testing.assert_close(compiled(x, torch.tensor([9, -10]), v), x.index_put((torch.tensor([9, -10]),), v * 2))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([0, 10]), v)


def test_deterministic_algorithms_keep_aten_for_stores(device):
    x, v = torch.randn(10, 4, device=device), torch.randn(3, 4, device=device)
    i = _unique(3, 10, device)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        source = check(lambda x, i, v: x.index_put((i,), v), x, i, v)
    finally:
        torch.use_deterministic_algorithms(was)
    assert aten_call(source, EXTERN)


def test_a_store_trains(device):
    """Gradients of `x.index_put((i,), f(v))` against eager: x's is the incoming gradient with the
    written rows zeroed, v's the incoming gradient gathered at them."""
    x, v = torch.randn(8, 4, device=device), torch.randn(3, 4, device=device)
    i = _unique(3, 8, device)
    grads_match(lambda x, i, v: x.index_put((i,), v.tanh()).sin(), x, i, v)
