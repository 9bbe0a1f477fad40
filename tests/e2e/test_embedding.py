"""Table lookups (aten.embedding) as loads at a run-time row, fused with what reads them
(lowering/ops/views.py `embedding`), against eager: layouts and dtypes of the table and the
indices, bounds, training, the backend, and the kernel count of a DLRM-like stack of tables."""

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
