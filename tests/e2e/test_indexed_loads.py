"""Loads at positions read from tensor data, fused with what reads them (lowering/ops/indexed.py:
`embedding`, `index_select`, `aten.index.Tensor` as `x[:, i, j]` writes it), against eager:
layouts and dtypes of the source and the indices, negative and out-of-range positions, training,
the backend, and kernel counts (an ATen kernel each before)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import check, kernel_count

import minicomp
import minicomp.dispatch.dynamo


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_lookup_fuses_with_its_reader(device, dtype, index_dtype):
    table = torch.randn(11, 6, device=device, dtype=dtype)
    indices = torch.tensor([[1, 10, 0], [3, 3, 7]], device=device, dtype=index_dtype)
    bias = torch.randn(6, device=device, dtype=dtype)
    source = check(lambda w, i, b: torch.relu(F.embedding(i, w) * 2 + b), table, indices, bias, kernels=1)
    assert "aten.embedding" in source


@pytest.mark.parametrize(
    "layout",
    [
        lambda w, i: (w.t().contiguous().t(), i),  # a column-major table
        lambda w, i: (w, i.t()),  # transposed indices
        lambda w, i: (w[::2], i // 2),  # a strided table
        lambda w, i: (w, i[0, 0]),  # a 0-d index: one row
    ],
    ids=["column-major", "transposed-indices", "strided-table", "scalar-index"],
)
def test_lookup_in_every_layout(device, layout):
    table, indices = layout(torch.randn(12, 5, device=device), torch.tensor([[1, 11, 4], [0, 2, 9]], device=device))
    check(lambda w, i: F.embedding(i, w) + 1, table, indices)


def test_lookups_of_many_tables_and_their_stack_are_one_kernel(device):
    """DLRM's forward: a vector per table, stacked beside the dense features' vector: one kernel
    (each lookup was an ATen call, plus a copy for the stack)."""
    tables = [torch.randn(9, 4, device=device) for _ in range(3)]
    sparse = torch.randint(0, 9, (5, 3), device=device)
    dense = torch.randn(5, 4, device=device)

    def fn(dense, sparse, *tables):
        return torch.stack([torch.relu(dense), *(F.embedding(sparse[:, k], t) for k, t in enumerate(tables))], 1)

    source = check(fn, dense, sparse, *tables)
    assert kernel_count(source) == 1


def test_index_out_of_range_raises():
    table = torch.randn(4, 3)
    compiled = minicomp.jit(lambda w, i: F.embedding(i, w) * 2)
    compiled(table, torch.tensor([0, 3]))
    for bad in (4, -1, 2**32 + 1):
        with pytest.raises((IndexError, RuntimeError)):
            compiled(table, torch.tensor([0, bad]))


def test_training_and_the_backend_match_eager():
    module = torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.Linear(4, 3))
    indices = torch.tensor([[0, 3, 9], [3, 3, 1]])
    expected = module(indices).square().sum()
    expected.backward()
    grads = [p.grad.clone() for p in module.parameters()]
    for compiled in (minicomp.jit(module), torch.compile(module, backend=minicomp.dispatch.dynamo.backend)):
        module.zero_grad()
        loss = compiled(indices).square().sum()
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for p, g in zip(module.parameters(), grads):
            torch.testing.assert_close(p.grad, g)


X = torch.randn(4, 5, 6)
P, Q = torch.tensor([0, 1, 3, -1]), torch.tensor([2, 3, 4, 0])  # valid in every dim of X; -1 counts from the end


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, a, b: x[:, a, b] * 2,  # adjacent: B takes their place ([4, 4])
        lambda x, a, b: x[a, :, b] + 1,  # apart: B goes first ([4, 5])
        lambda x, a, b: x[a] - 1,  # one index tensor, the rest sliced
        lambda x, a, b: x[a.view(2, 2), 1:3] * 3,  # a 2-d index, then a slice of what it selects
        lambda x, a, b: x[a[:, None], b[None, :]] * 2,  # indices broadcast together ([4, 4, 6])
        lambda x, a, b: x.index_select(1, b) * 2,
        lambda x, a, b: x.index_select(2, b[1]) + 1,  # a 0-d index
    ],
    ids=["adjacent", "apart", "one", "two-d", "broadcast", "index_select", "index_select-0d"],
)
def test_advanced_indexing_is_one_kernel(device, fn):
    x, a, b = X.to(device), P.to(device), Q.to(device)
    source = check(fn, x, a, b, kernels=1)
    assert "= aten.index" in source and "# extern" not in source.split("==== ")[0]


@pytest.mark.parametrize("layout", ["transposed", "int32", "bf16"])
def test_advanced_indexing_layouts_and_dtypes(device, layout):
    x, a, b = X.to(device), P.to(device), Q.to(device)
    if layout == "transposed":
        x = x.transpose(0, 2).contiguous().transpose(0, 2)
    if layout == "int32":
        a, b = a.int(), b.int()
    if layout == "bf16":
        x = x.bfloat16()
    check(lambda x, a, b: x[:, a, b] + x[a, 0, b], x, a, b)


@pytest.mark.parametrize("bad", [4, -5, 2**32 + 1])
def test_an_index_out_of_range_raises(bad):
    compiled = minicomp.jit(lambda x, a: x[a] * 2)
    compiled(X, P)
    with pytest.raises((IndexError, RuntimeError)):
        compiled(X, torch.tensor([0, bad]))
    with pytest.raises((IndexError, RuntimeError)):
        minicomp.jit(lambda x, b: x.index_select(0, b) * 2)(X, torch.tensor([0, bad]))


def test_a_bool_mask_stays_eager_and_right():
    x, mask = torch.randn(5, 3), torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(minicomp.jit(lambda x, m: x[m] * 2, fallback="silent")(x, mask), x[mask] * 2)


def test_advanced_indexing_gradients_match_eager():
    """Its backward is an index_put with accumulate: the scatter kind's atomic adds."""
    x = torch.randn(4, 5, 6, requires_grad=True)
    fn = lambda x, a, b: (x[:, a, b] * 2).square().sum()  # noqa: E731  (a repeated pair accumulates)
    a, b = torch.tensor([0, 1, 1, -1]), torch.tensor([2, 3, 3, 0])
    expected = torch.autograd.grad(fn(x, a, b), x)[0]
    for compiled in (minicomp.jit(fn), torch.compile(fn, backend=minicomp.dispatch.dynamo.backend)):
        torch.testing.assert_close(torch.autograd.grad(compiled(x, a, b), x)[0], expected)
