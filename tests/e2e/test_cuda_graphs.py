"""CUDA graphs (runtime/graphs.py) against eager on the GPU: `minicomp.jit(..., cuda_graphs=True)` and
`torch.compile(..., backend="minicomp", mode="reduce-overhead")` replay each signature's graph with
the right values when the caller writes into its inputs between calls, passes new tensors, keeps
earlier outputs (handed out uncopied, moved out when kept), accumulates gradients over graphed
backwards, returns views of its inputs, changes shapes (a graph each, at most the bound
kept), trains (forward and backward graphs, an optimizer step between), runs two forwards before
their backwards, draws random numbers; a CPU sync, a CPU tensor refuse cleanly. The last test
prints the host time of a graphed call beside a plain one."""

from __future__ import annotations

import copy
import logging
import time

import pytest
import torch

import minicomp
from minicomp.runtime.graphs import Graphs

pytestmark = pytest.mark.gpu

MOVES = hasattr(torch.UntypedStorage, "_swap_data_ptr_")  # torch >= 2.12: a held output moves out; else it is stale


def _kept_as_computed(kept):
    """Outputs kept across calls (the first a warm-up's, the second a capture's, then replays') hold
    their own call's values (torch >= 2.12); before, a replay's raise STALE when read once the graph
    ran again."""
    if MOVES:
        for out, expected in kept:
            torch.testing.assert_close(out, expected)
        return
    torch.testing.assert_close(*kept[0])  # the warm-up's outputs are not the graph's memory
    torch.testing.assert_close(*kept[-1])
    with pytest.raises(RuntimeError, match="a later call of the graph wrote over its memory"):
        torch.testing.assert_close(*kept[-2])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs_of(jitted) -> Graphs:
    return (jitted.compiled if isinstance(jitted, torch.nn.Module) else jitted).graphs


def test_jit_replays_with_inputs_written_and_outputs_kept():
    def f(x, y):
        return torch.nn.functional.gelu(x * y + 1).sum(-1), x - y

    jitted = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    y = torch.randn(64, 256, device="cuda")
    kept = []
    for _step in range(6):
        x = torch.randn(64, 256, device="cuda")  # a new address each call
        y.mul_(1.5)  # the caller writes into an input between calls
        out = jitted(x, y)
        kept.append((out, f(x, y)))
    _kept_as_computed(kept)  # no replay overwrote an earlier call's outputs unseen
    assert _graphs_of(jitted).recorded() == 1


def test_outputs_handed_out_uncopied_and_kept_ones_moved():
    """A replay's outputs are the graph's memory itself; one the caller keeps moves out before the
    next replay writes there (torch < 2.12: reading it raises)."""

    def f(x):
        y = x.exp()
        return y, y.t()

    jitted = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    warm = [torch.randn(16, 8, device="cuda") for _ in range(3)]  # at three addresses: copied into a buffer
    for x in warm:
        jitted(x)
    ((_, record),) = _graphs_of(jitted).kept.values()
    memory = {o.untyped_storage().data_ptr() for o in record.outputs}
    x1 = torch.randn(16, 8, device="cuda")
    a, a_t = jitted(x1)
    assert a.untyped_storage().data_ptr() in memory
    x2 = torch.randn(16, 8, device="cuda")
    b, _ = jitted(x2)
    assert b.untyped_storage().data_ptr() in memory
    torch.testing.assert_close(b, x2.exp())
    if not MOVES:
        with pytest.raises(RuntimeError, match="Clone it to keep it"):
            a.sum()
        return
    assert a.untyped_storage().data_ptr() not in memory
    torch.testing.assert_close(a, x1.exp())
    torch.testing.assert_close(a_t, x1.exp().t())


def test_an_input_passed_again_is_read_in_place_then_copied_once_it_moves():
    def f(x):
        return (x * 2).sin(), x[1:]

    jitted = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    x = torch.randn(16, 8, device="cuda")
    for _ in range(4):
        x.copy_(torch.randn_like(x))  # a buffer the caller refills: the graph reads it in place
        out, tail = jitted(x)
        torch.testing.assert_close(out, (x * 2).sin())
        assert tail.data_ptr() == x[1:].data_ptr()
    ((graphed, record),) = _graphs_of(jitted).kept.values()
    assert record.buffers == [] and graphed.buffered == set()
    ys = [torch.randn(16, 8, device="cuda") for _ in range(3)]
    for y in ys:  # elsewhere: this call runs without the graph, then it is recorded with a buffer
        out, tail = jitted(y)
        torch.testing.assert_close(out, (y * 2).sin())
        assert tail.data_ptr() == y[1:].data_ptr()
    ((graphed, record),) = _graphs_of(jitted).kept.values()
    assert [i for i, _, _ in record.buffers] == [0] and graphed.buffered == {0}


def test_jit_outputs_aliasing_inputs():
    def f(x):
        return x, x.t(), x[1:] * 2

    jitted = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    for _ in range(4):
        x = torch.randn(8, 16, device="cuda")
        same, view, out = jitted(x)
        assert same is x and view.data_ptr() == x.data_ptr() and view.stride() == (1, 16)
        torch.testing.assert_close(out, x[1:] * 2)


def test_jit_shape_change_rerecords_within_the_bound():
    def f(x):
        return torch.softmax(x * 3, -1)

    with minicomp.config.override(cuda_graph_limit=2):
        jitted = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    for rows in (4, 8, 16, 4, 8, 16, 4):
        for _ in range(3):
            x = torch.randn(rows, 128, device="cuda")
            torch.testing.assert_close(jitted(x), f(x))
        assert _graphs_of(jitted).recorded() <= 2


def test_module_params_in_place_and_a_static_cache_written():
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, cache, x, pos):
            cache.index_copy_(0, pos, self.proj(x))
            return cache.sum(0).relu()

    model = Step().cuda()
    jitted = minicomp.jit(model, cuda_graphs=True)
    cache, reference = torch.zeros(8, 32, device="cuda"), torch.zeros(8, 32, device="cuda")
    with torch.no_grad():
        for pos in range(8):
            if pos == 4:
                model.proj.weight.mul_(0.5)  # an update in place: the graph reads the parameter where it is
            x = torch.randn(1, 32, device="cuda")
            p = torch.tensor([pos], device="cuda")
            torch.testing.assert_close(jitted(cache, x, p), model(reference, x, p))
            torch.testing.assert_close(cache, reference)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).cuda()


def _train(model, steps, make_inputs, forwards_per_step=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        batch = [make_inputs(step, k) for k in range(forwards_per_step)]
        outs = [model(x).square().mean() for x in batch]  # every forward before any backward
        for loss in outs:
            loss.backward()
        opt.step()
        losses.append(torch.stack(outs).detach())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("forwards_per_step", [1, 2])
def test_training_through_torch_compile(forwards_per_step):
    """Forward and backward graphs, the optimizer between steps; with two forwards a step, the
    second runs without its graph (the first's saved values are still to be read)."""

    def inputs(step, k):
        return torch.randn(32, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(10 * step + k))

    eager = _mlp()
    plain, graphed = copy.deepcopy(eager), copy.deepcopy(eager)
    want, want_params = _train(torch.compile(plain, backend="minicomp"), 6, inputs, forwards_per_step)
    torch._dynamo.reset()
    got, got_params = _train(
        torch.compile(graphed, backend="minicomp", mode="reduce-overhead"), 6, inputs, forwards_per_step
    )
    for a, b in zip(got + got_params, want + want_params):  # the same kernels with and without graphs
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    eager_losses, eager_params = _train(eager, 6, inputs, forwards_per_step)
    for a, b in zip(got + got_params, eager_losses + eager_params):  # (TF32 in matmul templates: loose)
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_gradients_accumulated_over_graphed_backwards():
    """Gradients kept in .grad over two steps (zero_grad every second step): the backward's graph
    hands its gradients out uncopied, and the next backward moves the held ones out first."""

    def run(compiled, model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator("cuda").manual_seed(0)
        for step in range(8):
            if step % 2 == 0:
                opt.zero_grad(set_to_none=True)
            compiled(torch.randn(32, 64, device="cuda", generator=gen)).square().mean().backward()
            if step % 2 == 1:
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    eager = _mlp()
    plain, graphed = copy.deepcopy(eager), copy.deepcopy(eager)
    want = run(torch.compile(plain, backend="minicomp"), plain)
    torch._dynamo.reset()
    got = run(torch.compile(graphed, backend="minicomp", mode="reduce-overhead"), graphed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_options_spelling_and_outputs_kept():
    def f(x):
        return (x.sin() * 2).cos()

    compiled = torch.compile(f, backend="minicomp", options={"cuda_graphs": True})
    _kept_as_computed([(compiled(x), f(x)) for x in (torch.randn(1000, device="cuda") for _ in range(5))])


def test_dropout_draws_anew_each_replay():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + 1

    compiled = torch.compile(f, backend="minicomp", mode="reduce-overhead")
    x = torch.ones(4096, device="cuda")
    masks = [(compiled(x) == 1).clone() for _ in range(5)]
    assert not torch.equal(masks[-1], masks[-2])
    assert 0.4 < masks[-1].float().mean().item() < 0.6


def test_cpu_sync_and_cpu_tensor_refused(caplog):
    def synced(args):
        (x,) = args
        args.clear()
        return (x[: int(x.sum().item() > 0) + 1] * 2,)

    graphs = Graphs()
    f = graphs.wrap(synced, "synced")
    with caplog.at_level(logging.INFO, logger="minicomp.cudagraphs"):
        for _ in range(4):
            x = torch.randn(8, device="cuda")
            torch.testing.assert_close(f([x])[0], x[: int(x.sum().item() > 0) + 1] * 2)
        g = graphs.wrap(lambda args: (args[0] + args[1].cuda(),), "mixed")
        torch.testing.assert_close(
            g([torch.ones(2, device="cuda"), torch.ones(2)])[0], torch.full((2,), 2.0, device="cuda")
        )
    assert f.refused and "capturing it failed" in f.refused and graphs.recorded() == 0
    assert g.refused == "a CPU tensor is among its inputs"
    x = torch.randn(8, device="cuda")  # the device is usable after the failed capture
    torch.testing.assert_close(f([x])[0], x[: int(x.sum().item() > 0) + 1] * 2)


def test_host_overhead_of_a_graphed_call():
    """Prints the host time of a tiny call: plain minicomp, graphed minicomp (not asserted: timings)."""

    def f(x, y):
        return (x + y).relu()

    plain = minicomp.jit(f, fallback="raise")
    graphed = minicomp.jit(f, cuda_graphs=True, fallback="raise")
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    for name, fn in (("plain", plain), ("graphed", graphed)):
        for _ in range(20):
            fn(x, y)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            fn(x, y)
        host = (time.perf_counter() - start) / 2000 * 1e6
        torch.cuda.synchronize()
        print(f"host time of a call, {name}: {host:.1f} us")
    assert _graphs_of(graphed).recorded() == 1


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_static_cache_decoding(name):
    """transformers' decoders token by token into a StaticCache, graphed: each step as eager's."""
    transformers = pytest.importorskip("transformers")
    from test_decode_models import _gpt2, _llama  # the same tiny configs

    torch.manual_seed(0)
    model = (_gpt2() if name == "gpt2" else _llama()).cuda().eval()
    caches = [transformers.StaticCache(config=model.config, max_cache_len=32) for _ in range(2)]
    compiled = torch.compile(model, backend="minicomp", mode="reduce-overhead")
    with torch.no_grad():
        for position in range(8):
            token = torch.tensor([[position * 7 % 1000]], device="cuda")
            where = torch.tensor([position], device="cuda")
            got, want = (
                fn(input_ids=token, past_key_values=cache, cache_position=where, use_cache=True).logits
                for fn, cache in zip((compiled, model), caches)
            )
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
