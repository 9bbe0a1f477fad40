"""A mutated input's new value written into the input itself: a static KV cache's `index_copy_`
(functionalized to `index_put` and a `copy_` back) is a scatter kernel storing into the cache
(codegen/reuse.py `scatter_written_in_place`), and an extern op's result is written by ATen's
in-place form (`extern_written_in_place`), not into a copy of the whole cache copied back. Each
case against eager, through minicomp.jit and torch.compile; where the old value is still read
after, or read by the op's other arguments, the copy stays."""

from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.dispatch import dynamo


def cache_update(cache, pos, k):
    cache.index_copy_(2, pos, k)
    return cache.sum(-1) * 2.0


def old_read_after(cache, pos, k):
    before = cache.amax(-1)  # the old value: the plan may run it after the update
    cache.index_copy_(2, pos, k)
    return before + cache.sum(-1)


def view_returned(cache, pos, k):
    view = cache[:, :, 3]  # a view of the cache: eager's shows the update too
    cache.index_copy_(2, pos, k)
    return view, cache.sum(-1)


def values_from_the_cache(cache, pos, k):
    cache.index_copy_(2, pos, cache[:, :, 5:6])  # its values a view of the cache it writes
    return cache.sum(-1) + k.sum()


def cache_returned(cache, pos, k):
    cache.index_copy_(2, pos, k)
    return cache, cache[:, :, 2:4] * 3.0


def two_caches(keys, pos, k):
    values = keys * 0.5  # a second cache made from the first's old values (read before the update)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, -k)
    return keys.sum(-1), values.sum(-1)


def masked_fill_in_place(x, mask):
    x.masked_fill_(mask, -1.0)
    return x.mean()


def _inputs():
    torch.manual_seed(0)
    return torch.randn(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4)


def _run(fn, inputs, how):
    ref_inputs = [t.clone() for t in inputs]
    want = fn(*ref_inputs)
    compiled = minicomp.jit(fn, fallback="raise") if how == "jit" else torch.compile(fn, backend=dynamo.backend)
    torch._dynamo.reset()
    for _ in range(2):
        got_inputs = [t.clone() for t in inputs]
        got = compiled(*got_inputs)
        torch.testing.assert_close(got, want)
        for g, w in zip(got_inputs, ref_inputs):
            torch.testing.assert_close(g, w)  # the mutation, as eager's
    return compiled, got_inputs


@pytest.mark.parametrize("how", ["jit", "dynamo"])
@pytest.mark.parametrize(
    "fn", [cache_update, old_read_after, view_returned, values_from_the_cache, cache_returned, two_caches]
)
def test_against_eager(fn, how):
    _run(fn, _inputs(), how)


def test_the_cache_is_written_in_place():
    """A scatter kernel stores the token's values into the cache itself (codegen/reuse.py
    `scatter_written_in_place`): no copy of the cache before it, none back after."""
    compiled, _ = _run(cache_update, _inputs(), "jit")
    source = compiled.source(*_inputs())
    assert "index_put = cache  # the input's new value, written in place" in source
    assert "tl.store(out_ptr" in source and "aten.index_put" not in source.split("def call(")[1]
    assert ".copy_(" not in source  # no copy back


def test_the_copy_stays_where_the_op_reads_the_input_again():
    compiled, _ = _run(values_from_the_cache, _inputs(), "jit")
    source = compiled.source(*_inputs())
    assert "aten.index_put_" not in source and ".copy_(cache)" in source and "cache.copy_(" in source


def test_an_op_without_a_kernel_writes_in_place_through_aten():
    """An extern op whose result is the input's new value (deterministic algorithms keep the
    cache's update an ATen call): ATen's in-place form writes it."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        compiled, _ = _run(cache_update, _inputs(), "jit")
        source = compiled.source(*_inputs())
    finally:
        torch.use_deterministic_algorithms(was)
    assert "torch.ops.aten.index_put_.default._op(cache," in source
    assert ".copy_(" not in source


def test_another_in_place_form():
    """Any aten op with an in-place form: masked_fill's Tensor overload on an input."""
    x, mask = torch.randn(6, 5), torch.rand(6, 5) > 0.5
    compiled, (written, _) = _run(masked_fill_in_place, [x, mask], "jit")
    torch.testing.assert_close(written, x.masked_fill(mask, -1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_cache_updates_in_place(graphs):
    """On CUDA, with and without CUDA graphs: a cache written one position a call, as decoding with
    a static cache does, equals eager's after each call (the graph replays the in-place write)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    cache = torch.zeros(1, 4, 16, 8, device="cuda", dtype=torch.bfloat16)
    ref_cache = cache.clone()
    compiled = minicomp.jit(cache_update, fallback="raise", cuda_graphs=graphs)
    for step in range(6):
        pos = torch.tensor([step], device="cuda")
        k = torch.randn(1, 4, 1, 8, device="cuda", dtype=torch.bfloat16)
        got = compiled(cache, pos, k)
        want = cache_update(ref_cache, pos, k)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(cache, ref_cache)
