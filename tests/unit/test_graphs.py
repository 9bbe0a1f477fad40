"""CUDA graphs' bookkeeping (runtime/graphs.py) on the CPU, with a stand-in for the device: warm-up,
capture and replay per signature, inputs copied or read in place, outputs handed out uncopied
(moved out when kept), a static input that moves, the bound on graphs kept, a training forward's
saved values, and each refusal.

The stand-in graph reads and writes memory by address, as a CUDA graph does: its replay runs the
callable again on tensors rebuilt at the captured addresses and writes the results into the
captured outputs."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch

import minicomp
from minicomp.runtime import graph_outputs
from minicomp.runtime import graphs as cuda_graphs
from minicomp.runtime.graphs import CaptureRefused, CudaCapture, Graphs

# Outputs kept across calls move out of the graph's memory (torch >= 2.12); a CUDA build of an older
# torch marks them stale instead, also for the stand-in's CPU tensors (the GPU machine's torch 2.11)
needs_moves = pytest.mark.skipif(
    not graph_outputs._moves and graph_outputs._poison is not None,
    reason="this torch marks a held output stale instead of moving it",
)


def _at(t: torch.Tensor) -> torch.Tensor:
    """A tensor at `t`'s address that does not keep `t`'s memory alive (what a graph holds)."""
    storage = t.untyped_storage()
    memory = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(memory, t.storage_offset(), t.shape, t.stride())


class FakeGraph:
    def __init__(self, run, args, outputs):
        self.run, self.outputs = run, outputs
        self.args = [_at(a) if isinstance(a, torch.Tensor) else a for a in args]
        self.replays = 0

    def replay(self):
        self.replays += 1
        for out, new in zip(self.outputs, self.run(list(self.args))):
            if isinstance(out, torch.Tensor) and out.data_ptr() != new.data_ptr():  # (not an input it returns)
                out.copy_(new)


class FakeDevice:
    """CudaCapture's stand-in: CPU tensors, captures that run the callable once (then put back what
    it wrote into its inputs, as a capture runs nothing)."""

    def __init__(self):
        self.warmups = self.captures = 0
        self.capturing = False
        self.graphs: list[FakeGraph] = []

    def device_of(self, tensors):
        if any(t.device.type != "cpu" for t in tensors):
            raise CaptureRefused("not a CPU tensor")
        return 0

    def failed(self, device):
        pass

    def warmup(self, run, args, device):
        self.warmups += 1
        return run(args)

    def capture(self, run, args, device):
        self.captures += 1
        kept = list(args)
        before = [(a, a.clone()) for a in kept if isinstance(a, torch.Tensor)]
        self.capturing = True
        try:
            outputs = run(args)
        finally:
            self.capturing = False
        with torch.no_grad():
            for a, value in before:  # a capture runs nothing: what it wrote into its inputs is undone
                if not torch.equal(a, value):
                    a.copy_(value)
        del before
        graph = FakeGraph(run, kept, outputs)
        del kept
        self.graphs.append(graph)
        return graph, outputs


def _boxed(fn):
    def run(args):
        values = list(args)
        args.clear()
        return fn(*values)

    return run


@pytest.fixture
def device():
    return FakeDevice()


@needs_moves
def test_warmup_capture_replay_and_copies(device):
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x, y: ((x * 2 + y).sin(),)), "f")
    y = torch.randn(8)
    results = []
    for _step in range(5):
        x = torch.randn(8)  # a new address each call: copied into the graph's buffer
        (out,) = f([x, y])
        torch.testing.assert_close(out, (x * 2 + y).sin())
        results.append((out, (x * 2 + y).sin()))
    assert (device.warmups, device.captures) == (1, 1)
    assert device.graphs[0].replays == 4  # the capturing call replays too
    for out, expected in results:  # each call's output is its own: a later replay wrote none of them
        torch.testing.assert_close(out, expected)
    y.add_(1)  # the second input too lives in a buffer: a change of the caller's tensor is copied in
    x = torch.randn(8)
    torch.testing.assert_close(f([x, y])[0], (x * 2 + y).sin())


def test_static_inputs_read_in_place(device):
    graphs = Graphs(limit=4, rerecords=2, device=device)
    w = torch.randn(8)
    f = graphs.wrap(_boxed(lambda w, x: (w * x,)), "f", static=[0])
    xs = [torch.randn(8) for _ in range(3)]  # (all alive: each at its own address)
    for x in xs:
        f([w, x])
    record = next(iter(f.records.values()))
    assert [i for i, _, _ in record.buffers] == [1]  # w has no buffer ...
    with torch.no_grad():
        w.mul_(3)  # ... an optimizer step in place is read by the next replay
    x = torch.randn(8)
    torch.testing.assert_close(f([w, x])[0], w * x)


def test_moved_static_input_rerecords_then_refuses(device, caplog):
    graphs = Graphs(limit=4, rerecords=1, device=device)
    f = graphs.wrap(_boxed(lambda w, x: (w + x,)), "f", static=[0])
    x = torch.randn(4)
    w = torch.randn(4)
    for _ in range(3):
        f([w, x])
    with caplog.at_level(logging.INFO, logger="minicomp.cudagraphs"):
        for _ in range(2):  # a replaced parameter: two calls in a row without the graph, then recorded again
            w = torch.randn(4)
            torch.testing.assert_close(f([w, x])[0], w + x)
        assert device.captures == 1 and "recording its graph again" in caplog.text
        torch.testing.assert_close(f([w, x])[0], w + x)
        assert device.captures == 2
        torch.testing.assert_close(f([w, x])[0], w + x)  # replayed at the new address
        for _ in range(2):
            w = torch.randn(4)
            torch.testing.assert_close(f([w, x])[0], w + x)
    assert f.refused is not None and "moved" in f.refused and graphs.recorded() == 0
    w = torch.randn(4)
    torch.testing.assert_close(f([w, x])[0], w + x)


def test_shape_change_records_a_graph_each_and_the_bound_holds(device):
    graphs = Graphs(limit=2, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.exp(),)), "f")
    g = graphs.wrap(_boxed(lambda x: (x + 1,)), "g")
    for n in (3, 4, 5):
        for _ in range(3):
            x = torch.randn(n)
            torch.testing.assert_close(f([x])[0], x.exp())
    assert device.captures == 3 and graphs.recorded() == 2  # the oldest of three signatures dropped
    for _ in range(3):
        x = torch.randn(2)
        torch.testing.assert_close(g([x])[0], x + 1)
    assert graphs.recorded() == 2 and len(f.records) + len(g.records) == 2  # one bound over the model's graphs
    x = torch.randn(3)  # dropped: warmed up already, so recorded again at once
    torch.testing.assert_close(f([x])[0], x.exp())
    assert device.captures == 5


def test_capture_failure_refuses_cleanly(device, caplog):
    graphs = Graphs(limit=4, rerecords=2, device=device)

    def synced(x):
        if device.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return (x[: int(x.sum().item() > 0) + 1] * 2,)

    f = graphs.wrap(_boxed(synced), "synced")
    with caplog.at_level(logging.INFO, logger="minicomp.cudagraphs"):
        for _ in range(4):
            x = torch.randn(4)
            torch.testing.assert_close(f([x])[0], synced(x)[0])
    assert "synced runs without CUDA graphs: capturing it failed (RuntimeError: CUDA error" in caplog.text
    assert device.captures == 1 and graphs.recorded() == 0


def test_cpu_tensors_refused_by_the_cuda_side():
    graphs = Graphs(limit=4, rerecords=2, device=CudaCapture())
    f = graphs.wrap(_boxed(lambda x: (x + 1,)), "f")
    x = torch.randn(3)
    torch.testing.assert_close(f([x])[0], x + 1)
    assert f.refused == "a CPU tensor is among its inputs"
    with pytest.raises(CaptureRefused):
        CudaCapture().device_of([torch.randn(1), torch.randn(1, device="meta")])


def test_an_input_it_writes_into_is_read_in_place(device):
    graphs = Graphs(limit=4, rerecords=1, device=device)

    def step(cache, x, pos):
        cache.index_copy_(0, pos, x[None])  # a static KV cache's update at a position held in a tensor
        return (cache.sum(0),)

    f = graphs.wrap(_boxed(step), "step")
    cache = torch.zeros(4, 3)
    for pos in range(4):
        x = torch.randn(3)
        expected = cache.sum(0) + x
        torch.testing.assert_close(f([cache, x, torch.tensor([pos])])[0], expected)
        assert torch.equal(cache[pos], x)  # the caller's tensor has each replay's write
    assert 0 in f.static and device.captures == 1


def test_saved_values_in_place_and_a_pending_backward(device, caplog):
    """A training forward hands its saved values to the backward uncopied; a second forward before
    the first's backward runs without its graph, so each backward reads its own values."""
    graphs = Graphs(limit=4, rerecords=4, device=device)
    forward = graphs.wrap(_boxed(lambda w, x: ((w * x).sum(), (w * x).tanh())), "fw", static=[0], saved=1)
    backward = graphs.wrap(_boxed(lambda w, t, g: ((1 - t * t) * g * w,)), "bw", static=[0, 1])
    w = torch.randn(5)

    def grad(x):
        return (1 - (w * x).tanh() ** 2) * w

    for _ in range(4):  # forward, backward, as a training loop
        x = torch.randn(5)
        loss, saved = forward([w, x])
        torch.testing.assert_close(loss, (w * x).sum())
        (dx,) = backward([w, saved, torch.ones(())])
        del saved
        torch.testing.assert_close(dx, grad(x))
    assert (device.captures, [g.replays for g in device.graphs]) == (2, [3, 3])  # neither copied its saved value
    with caplog.at_level(logging.INFO, logger="minicomp.cudagraphs"):
        x1, x2 = torch.randn(5), torch.randn(5)
        _, saved1 = forward([w, x1])
        _, saved2 = forward([w, x2])  # saved1 still in use: no replay over it
        torch.testing.assert_close(backward([w, saved2, torch.ones(())])[0], grad(x2))
        torch.testing.assert_close(backward([w, saved1, torch.ones(())])[0], grad(x1))
    assert "still in use" in caplog.text and device.captures == 2


def test_saved_input_in_a_buffer_waits_for_its_backward(device):
    """A forward that saves an input of its own (a linear layer's x, for the weight's gradient): the
    value lives in the graph's buffer, which the next call's copy would overwrite."""
    graphs = Graphs(limit=4, rerecords=4, device=device)
    forward = graphs.wrap(_boxed(lambda w, x: ((w * x).sum(), x)), "fw", static=[0], saved=1)
    backward = graphs.wrap(_boxed(lambda x, g: (x * g,)), "bw", static=[0])
    w = torch.randn(5)
    for _ in range(3):
        x = torch.randn(5)
        _, saved = forward([w, x])
        torch.testing.assert_close(backward([saved, torch.ones(())])[0], x)
        del saved
    x1, x2 = torch.randn(5), torch.randn(5)
    _, saved1 = forward([w, x1])
    _, saved2 = forward([w, x2])
    torch.testing.assert_close(backward([saved1, torch.ones(())])[0], x1)
    torch.testing.assert_close(backward([saved2, torch.ones(())])[0], x2)


def test_outputs_that_are_inputs_come_back_as_aliases(device):
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda w, x: (w.t(), x * 2)), "f", static=[0])
    w = torch.randn(2, 3)
    for _ in range(3):
        view, out = f([w, torch.ones(3)])
        assert view.data_ptr() == w.data_ptr() and view.stride() == (1, 3)
        torch.testing.assert_close(out, torch.full((3,), 2.0))


@needs_moves
def test_outputs_sharing_memory_come_back_as_views_of_one_memory(device):
    """Outputs that view one memory (at offsets, transposed) come back as views of one storage over
    the graph's memory; kept across calls, they move out of it together, still views of one another."""
    graphs = Graphs(limit=4, rerecords=2, device=device)

    def f(x):
        y = x * 2
        return y, y[1:], y.t(), x + 1

    g = graphs.wrap(_boxed(f), "f")
    kept = []
    for _ in range(4):
        x = torch.randn(3, 4)
        out = g([x])
        kept.append((out, f(x)))
        y, tail, t, other = out
        assert tail.data_ptr() == y.data_ptr() + 4 * 4 and t.stride() == (1, 4) and t.data_ptr() == y.data_ptr()
    for out, expected in kept:
        for a, b in zip(out, expected):
            torch.testing.assert_close(a, b)
        y, tail, t, _ = out
        assert tail.data_ptr() == y.data_ptr() + 4 * 4 and t.data_ptr() == y.data_ptr()
    record = next(iter(g.records.values()))
    assert [[v.index for v in m.views] for m in record.plan.memories] == [[0, 1, 2], [3]]


def _graph_memory(record) -> set[int]:
    return {o.untyped_storage().data_ptr() for o in record.outputs}


@needs_moves
def test_outputs_are_handed_out_uncopied_and_move_only_when_kept(device):
    """Each call's outputs are the graph's memory itself; the next replay moves out only what the
    caller still holds (here the first call's output), not what it dropped."""
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.exp(),)), "f")
    for _ in range(3):  # warm-up, capture, replay: outputs dropped at once
        x = torch.randn(6)
        torch.testing.assert_close(f([x])[0], x.exp())
    memory = _graph_memory(next(iter(f.records.values())))
    x1 = torch.randn(6)
    (kept,) = f([x1])
    assert kept.untyped_storage().data_ptr() in memory  # no copy on the way out
    x2 = torch.randn(6)
    (second,) = f([x2])
    assert second.untyped_storage().data_ptr() in memory
    assert kept.untyped_storage().data_ptr() not in memory  # moved out before the replay wrote there
    torch.testing.assert_close(kept, x1.exp())
    torch.testing.assert_close(second, x2.exp())
    del kept
    (third,) = f([torch.zeros(6)])
    torch.testing.assert_close(third, torch.ones(6))


@needs_moves
def test_a_storage_no_caller_holds_is_handed_out_again(device):
    """The storage over the graph's memory a call handed out is handed out again by the next call
    when the caller dropped every tensor over it; one still held (the output, or a view of it)
    moves out, and the next call gets a new one."""
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.exp(),)), "f")
    for _ in range(3):
        f([torch.randn(6)])
    record = next(iter(f.records.values()))
    memory = _graph_memory(record)
    first = record.handed[0]
    for _ in range(2):
        x = torch.randn(6)
        torch.testing.assert_close(f([x])[0], x.exp())
    assert record.handed[0] is first
    x1 = torch.randn(6)
    view = f([x1])[0][2:]  # a view of the output held
    x2 = torch.randn(6)
    (out,) = f([x2])
    assert record.handed[0] is not first and first.data_ptr() not in memory
    torch.testing.assert_close(view, x1.exp()[2:])
    torch.testing.assert_close(out, x2.exp())
    second = record.handed[0]
    x3 = torch.randn(6)
    torch.testing.assert_close(f([x3])[0], x3.exp())  # `out` held
    assert record.handed[0] is not second
    torch.testing.assert_close(out, x2.exp())


def test_a_storage_marked_stale_is_not_handed_out_again(device, monkeypatch):
    """Where storages cannot move, a held output's storage is marked stale. Its holder may drop it
    while the graph replays (another thread): the next hand-out still makes a new storage, where
    one dropped before the call is handed out again."""
    marked, made = [], []
    monkeypatch.setattr(graph_outputs, "_moves", False)
    monkeypatch.setattr(graph_outputs, "_poison", lambda cdata, message: marked.append(cdata))
    real_make = torch._C._construct_storage_from_data_pointer
    monkeypatch.setattr(torch._C, "_construct_storage_from_data_pointer", lambda *a: made.append(1) or real_make(*a))
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.exp(),)), "f")
    for _ in range(3):
        f([torch.randn(5)])
    record = next(iter(f.records.values()))
    made.clear()
    f([torch.randn(5)])  # the last call's output was dropped: its storage handed out again
    assert made == []
    held = [f([torch.randn(5)])[0]]
    real_replay = record.launch  # (the graph's replay, bound at capture)

    def replay():  # the holder drops its output while the graph replays
        held.clear()
        real_replay()

    monkeypatch.setattr(record, "launch", replay)
    x = torch.randn(5)
    (out,) = f([x])
    assert len(marked) == 1 and made == [1]
    torch.testing.assert_close(out, x.exp())


def test_without_moves_a_held_output_is_marked_and_kept_ones_copied(device, monkeypatch):
    """torch < 2.12 cannot move a storage: a held output is marked stale (reading it raises, on a
    GPU) and the outputs callers keep as a rule (`kept`: gradients) come back as copies."""
    marked = []
    monkeypatch.setattr(graph_outputs, "_moves", False)
    monkeypatch.setattr(graph_outputs, "_poison", lambda cdata, message: marked.append((cdata, message)))
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.exp(),)), "f")
    g = graphs.wrap(_boxed(lambda x: (x * 2,)), "g", kept=True)
    for _ in range(3):  # outputs dropped at once: nothing to mark
        x = torch.randn(5)
        torch.testing.assert_close(f([x])[0], x.exp())
        torch.testing.assert_close(g([x])[0], x * 2)
    assert marked == []
    (held,) = f([torch.randn(5)])
    f([torch.randn(5)])
    assert marked == [(held.untyped_storage()._cdata, graph_outputs.STALE)]
    memory = {o.untyped_storage().data_ptr() for o in next(iter(g.records.values())).outputs}
    x1 = torch.randn(5)
    (grad,) = g([x1])
    g([torch.randn(5)])
    assert grad.untyped_storage().data_ptr() not in memory
    torch.testing.assert_close(grad, x1 * 2)
    monkeypatch.setattr(graph_outputs, "_poison", None)  # nothing can mark it: copies for every graph
    h = graphs.wrap(_boxed(lambda x: (x + 1,)), "h")
    kept = [(h([x])[0], x + 1) for x in (torch.randn(5) for _ in range(4))]
    for out, expected in kept:
        torch.testing.assert_close(out, expected)
    assert len(marked) == 1


@needs_moves
def test_outputs_held_when_their_graph_is_dropped_move_out(device):
    graphs = Graphs(limit=1, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x * 3,)), "f")
    held = []
    for n in (4, 5):  # the second signature's graph drops the first's
        for _ in range(3):
            x = torch.randn(n)
            held.append((f([x])[0], x * 3))
    assert graphs.recorded() == 1
    for _ in range(3):  # the pool's memory of the dropped graph is the new captures' to use
        f([torch.randn(6)])
    for out, expected in held:
        torch.testing.assert_close(out, expected)


def test_an_output_that_views_a_copied_input_views_the_callers_tensor(device):
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x.t(), x * 2)), "f")
    for _ in range(4):
        x = torch.randn(2, 3)
        before = x.clone()
        view, doubled = f([x])
        assert view.data_ptr() == x.data_ptr() and view.stride() == (1, 3)  # as eager returns it
        view[0, 0] = 7.0
        assert x[0, 0] == 7.0
        torch.testing.assert_close(doubled, before * 2)


def test_an_input_passed_again_is_read_in_place_until_it_moves(device, caplog):
    """A caller that passes the same tensor (or refills it) pays no copy; the first call with the
    input at another address runs without the graph, and from then on it is copied into a buffer."""
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x * 2 + 1,)), "f")
    x = torch.randn(6)
    for _ in range(4):
        x.copy_(torch.randn(6))  # a static input buffer the caller refills
        torch.testing.assert_close(f([x])[0], x * 2 + 1)
    record = next(iter(f.records.values()))
    assert record.buffers == [] and record.static_ptrs == [(0, x.data_ptr())] and device.captures == 1
    with caplog.at_level(logging.INFO, logger="minicomp.cudagraphs"):
        for _ in range(3):
            y = torch.randn(6)  # at another address (x is alive)
            torch.testing.assert_close(f([y])[0], y * 2 + 1)
    assert "copied into a buffer from now on" in caplog.text
    assert f.buffered == {0} and device.captures == 2
    assert [i for i, _, _ in next(iter(f.records.values())).buffers] == [0]
    torch.testing.assert_close(f([x])[0], x * 2 + 1)  # the first tensor again: copied too


def test_an_output_viewing_an_input_read_in_place_views_the_callers_tensor(device):
    """The input is a slice of a larger tensor (storage offset 4): outputs viewing it are rebuilt on
    the caller's tensor from its own first element; one in another dtype (a bit view) cannot be,
    so that input is copied into a buffer and the output comes back in its dtype."""
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda x: (x[1:].t(), x.sum(0))), "f")
    base = torch.randn(5, 2)
    x = base[2:]
    for _ in range(3):
        view, total = f([x])
        assert view.data_ptr() == x[1:].data_ptr() and view.stride() == (1, 2)
        torch.testing.assert_close(total, x.sum(0))
    assert next(iter(f.records.values())).buffers == []
    view[0, 0] = 9.0
    assert x[1, 0] == 9.0

    g = graphs.wrap(_boxed(lambda x: (x.view(torch.int32), x + 1)), "g")
    y = torch.randn(4)
    for _ in range(3):
        bits, plus = g([y])
        assert bits.dtype == torch.int32 and torch.equal(bits, y.view(torch.int32))
        torch.testing.assert_close(plus, y + 1)
    assert g.buffered == {0} and device.captures == 3  # (f once, g twice)


def test_inputs_sharing_memory_are_copied(device):
    """Two slices of one tensor: an output viewing that memory could belong to either, so both are
    copied into buffers."""
    graphs = Graphs(limit=4, rerecords=2, device=device)
    f = graphs.wrap(_boxed(lambda a, b: (a * b,)), "f")
    qk = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(f([qk[0], qk[1]])[0], qk[0] * qk[1])
    assert f.buffered == {0, 1}


def test_a_forward_called_twice_right_after_its_capture_keeps_each_saved_value(device):
    """A forward saving its own input (in the graph's buffer): the call that captures hands it
    out, and a second forward before its backward must see it held, so no local of the capture may
    count as a holder (a buffer named by one did, and the second call copied over the first's)."""
    graphs = Graphs(limit=4, rerecords=4, device=device)
    forward = graphs.wrap(_boxed(lambda w, x: ((w * x).sum(), x)), "fw", static=[0], saved=1)
    w = torch.randn(5)
    forward([w, torch.randn(5)])  # warm-up
    x1, x2 = torch.randn(5), torch.randn(5)
    _, saved1 = forward([w, x1])  # captured
    _, saved2 = forward([w, x2])
    assert device.captures == 1
    torch.testing.assert_close(saved1, x1)
    torch.testing.assert_close(saved2, x2)


def test_options_of_torch_compile():
    """torch.compile's mode and options reach the backend; unknown ones fail with their names."""
    from minicomp.dispatch.dynamo import _options

    assert _options(None, "reduce-overhead") == {"cuda_graphs": True}
    assert _options({"cuda_graphs": True, "max_parts": 1}, None) == {"cuda_graphs": True, "max_parts": 1}
    with pytest.raises(minicomp.ConfigError, match="no option 'cudagraphs'"):
        _options({"cudagraphs": True}, None)
    with pytest.raises(minicomp.ConfigError, match="modes default, reduce-overhead"):
        _options(None, "max-autotune")


def test_opt_in_on_cpu_runs_without_graphs():
    """CPU modules are interpreted: the opt-in changes nothing (jit, a module, torch.compile)."""

    def f(x, y):
        return (x * y).relu() + 1

    x, y = torch.randn(6), torch.randn(6)
    jitted = minicomp.jit(f, cuda_graphs=True)
    for _ in range(3):
        torch.testing.assert_close(jitted(x, y), f(x, y))
    module = minicomp.jit(torch.nn.Linear(4, 3), cuda_graphs=True)
    with torch.no_grad():
        torch.testing.assert_close(module(torch.ones(2, 4)), module.module(torch.ones(2, 4)))
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=minicomp.dispatch.dynamo.backend, options={"cuda_graphs": True})
    torch.testing.assert_close(compiled(x, y), f(x, y))
    assert cuda_graphs.CudaCapture  # (the module imports without CUDA)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))


def _train(model, steps, forwards_per_step=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    values = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(step)
        losses = [model(torch.randn(3, 4, generator=g)).square().mean() for _ in range(forwards_per_step)]
        for loss in losses:  # every forward before any backward
            loss.backward()
        opt.step()
        values += [loss.detach() for loss in losses]
    return values + [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("forwards_per_step", [1, 2])
def test_training_through_torch_compile_with_stand_in_graphs(monkeypatch, forwards_per_step):
    """The Dynamo backend's forward and backward graphed (AOTAutograd's runtime between them): the
    parameters read in place, the saved activations handed to the backward uncopied, a second
    forward before the first's backward run without its graph; values as eager's, step by step."""
    from minicomp.dispatch import dynamo, graphed_calls

    device, made = FakeDevice(), []

    class Wrapping(Graphs):  # the callables it graphs, in order (the forward, then the backward)
        def wrap(self, *args, **kwargs):
            self.wrapped.append(super().wrap(*args, **kwargs))
            return self.wrapped[-1]

    def graphs(settings, inputs):
        made.append(Wrapping(limit=8, rerecords=8, device=device))
        made[-1].wrapped = []
        return made[-1]

    monkeypatch.setattr(graphed_calls, "graphs", graphs)
    torch._dynamo.reset()
    eager, compiled = _mlp(), _mlp()
    graphed = torch.compile(compiled, backend=dynamo.backend, options={"cuda_graphs": True})
    for a, b in zip(_train(graphed, 6, forwards_per_step), _train(eager, 6, forwards_per_step)):
        torch.testing.assert_close(a, b)
    (graphs,) = made
    forward, backward = graphs.wrapped
    # the forward's graph and the backward's, each recorded once, and once more for an input the
    # capture read in place that came at another address later (x, the tangent: temporaries the
    # allocator may or may not put where the warm-up's were). Such a call runs without the graph
    # and drops its record, the next call records it again: after a move on the last step,
    # `graphs.kept` holds one. A forward run without its graph puts its saved values elsewhere: the
    # backward's static inputs moved, and its second such call in a row records it again.
    assert forward.refused is None and backward.refused is None
    buffered = len(forward.buffered) + len(backward.buffered)
    assert 2 <= device.captures <= 2 + buffered + forward.rerecorded + backward.rerecorded
    assert 1 <= len(graphs.kept) <= 2
    for graphed in forward, backward:  # 5 calls after the warm-up: at most a move and its miss lost
        assert sum(g.replays for g in device.graphs if g.run is graphed.run) >= 3
    assert len(forward.static) == 4 and len(forward.dynamic) == 1  # the parameters in place, x not
    assert len(backward.dynamic) == 1  # only the tangent dynamic: saved values and parameters in place
    torch._dynamo.reset()


@needs_moves
def test_jit_module_with_stand_in_graphs():
    """minicomp.jit(module, cuda_graphs=True): parameters read in place (an update between calls is
    seen), outputs handed out, an input the module writes into kept in place."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)

        def forward(self, cache, x, pos):
            cache.index_copy_(0, pos, self.proj(x))
            return cache.sum(0).relu()

    model = Step()
    jitted = minicomp.jit(model, cuda_graphs=True, fallback="raise")
    device = FakeDevice()
    jitted.compiled.graphs = Graphs(limit=4, rerecords=2, device=device)
    cache, reference = torch.zeros(4, 3), torch.zeros(4, 3)
    outs = []
    with torch.no_grad():
        for pos in range(4):
            if pos == 2:
                model.proj.weight.mul_(0.5)
            x, p = torch.randn(1, 3), torch.tensor([pos])
            outs.append((jitted(cache, x, p), model(reference, x, p)))
            torch.testing.assert_close(cache, reference)
    for a, b in outs:
        torch.testing.assert_close(a, b)
    assert device.captures == 1 and device.graphs[0].replays == 3


def test_dynamic_sizes_through_torch_compile_with_stand_in_graphs(monkeypatch):
    """Dynamo's dynamic graph (a size as an input) graphed per size: each size its own graph, the
    bound over them kept."""
    from minicomp.dispatch import dynamo, graphed_calls

    device = FakeDevice()
    made = []

    def graphs(settings, inputs):
        made.append(Graphs(limit=2, rerecords=8, device=device))
        return made[-1]

    monkeypatch.setattr(graphed_calls, "graphs", graphs)
    torch._dynamo.reset()

    def f(x):
        return (x * 2).relu().sum(0)

    compiled = torch.compile(f, backend=dynamo.backend, mode="reduce-overhead")
    for n in (3, 4, 5, 6, 4, 5, 6):
        for _ in range(3):
            x = torch.randn(n, 2)
            torch.testing.assert_close(compiled(x), f(x))
    assert all(g.recorded() <= 2 for g in made) and device.captures >= 4
    torch._dynamo.reset()


def test_static_cache_through_torch_compile_with_stand_in_graphs(monkeypatch):
    """A decoding step that writes the new position into a cache it is passed (transformers'
    StaticCache): each replay's write reaches the caller's cache, the outputs are right."""
    from minicomp.dispatch import dynamo, graphed_calls

    device = FakeDevice()
    monkeypatch.setattr(graphed_calls, "graphs", lambda settings, inputs: Graphs(limit=4, rerecords=4, device=device))
    torch._dynamo.reset()

    def step(cache, x, pos):
        cache.index_copy_(0, pos, x * 2)
        return cache.sum(0)

    compiled = torch.compile(step, backend=dynamo.backend, mode="reduce-overhead")
    cache, reference = torch.zeros(6, 3), torch.zeros(6, 3)
    with torch.no_grad():
        for i in range(6):
            x, pos = torch.randn(1, 3), torch.tensor([i])
            torch.testing.assert_close(compiled(cache, x, pos), step(reference, x, pos))
            torch.testing.assert_close(cache, reference)
    assert device.captures == 1
    torch._dynamo.reset()


@pytest.mark.slow
def test_gpt2_static_cache_decoding_with_stand_in_graphs(monkeypatch):
    """transformers' GPT-2 decoding token by token into a StaticCache through the backend with
    graphs: the parameters and the cache read in place, the token and position copied in, each
    step's logits and cache as eager's."""
    transformers = pytest.importorskip("transformers")
    from minicomp.dispatch import dynamo, graphed_calls

    device = FakeDevice()
    monkeypatch.setattr(graphed_calls, "graphs", lambda settings, inputs: Graphs(limit=4, rerecords=4, device=device))
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    caches = [transformers.StaticCache(config=config, max_cache_len=16) for _ in range(2)]
    compiled = torch.compile(model, backend=dynamo.backend, mode="reduce-overhead")
    with torch.no_grad():
        for position in range(5):
            token, where = torch.tensor([[position * 7 % 100]]), torch.tensor([position])
            got, want = (
                fn(input_ids=token, past_key_values=cache, cache_position=where, use_cache=True).logits
                for fn, cache in zip((compiled, model), caches)
            )
            torch.testing.assert_close(got, want)
    assert device.captures == 1 and device.graphs[0].replays == 3
    torch._dynamo.reset()


def _graphed_jit(fn, device, limit: int = 4):
    jitted = minicomp.jit(fn, cuda_graphs=True, fallback="raise")
    jitted.graphs = Graphs(limit=limit, rerecords=2, device=device)
    return jitted


@needs_moves
def test_a_graphed_signature_replays_by_the_hot_path(device, monkeypatch):
    """After its capture, a signature's calls replay its record by the hot path (dispatch/hot_path.py:
    no key, no Graphed layers); an input at another address goes the keyed way, and the record made
    then (that input copied into a buffer) is hot in turn."""

    def f(x, y):
        return (x * 2 + y).sin()

    jitted = _graphed_jit(f, device)
    x, y = torch.randn(8), torch.randn(8)
    for _ in range(3):  # warm-up, capture, a replay by the key (which makes the record hot)
        torch.testing.assert_close(jitted(x, y), f(x, y))
    keyed = []
    real = jitted._key
    monkeypatch.setattr(jitted, "_key", lambda *a: keyed.append(1) or real(*a))
    replays = device.graphs[0].replays
    for _ in range(3):
        x.copy_(torch.randn(8))  # new values where the graph reads them
        torch.testing.assert_close(jitted(x, y), f(x, y))
    assert keyed == [] and device.graphs[0].replays == replays + 3
    outputs = []
    for _step in range(4):  # a new tensor each call: x is copied into a buffer from the next capture on
        x = torch.randn(8)
        outputs.append((jitted(x, y), f(x, y)))
        torch.testing.assert_close(*outputs[-1])
    assert device.captures == 2 and keyed == [1, 1]  # moved (runs without the graph), then recorded again
    for got, want in outputs:  # each call's output is its own
        torch.testing.assert_close(got, want)


def test_a_dropped_record_is_not_replayed_by_the_hot_path(device):
    """A hot signature whose record is dropped (here: its graphs refused) misses on the hot path and
    runs as the Graphed decides; with one graph kept, two signatures in turn drop each other's."""

    def f(x):
        return x.exp() + 1

    jitted = _graphed_jit(f, device, limit=1)
    x = torch.randn(3)
    for _ in range(3):
        jitted(x)
    hot = jitted._hot
    assert hot is not None and hot.record() is not None
    hot.graphed.refuse("a test")
    replays = device.graphs[0].replays
    x.copy_(torch.randn(3))
    torch.testing.assert_close(jitted(x), f(x))
    assert device.graphs[0].replays == replays  # not replayed: run as compiled
    other = _graphed_jit(f, device, limit=1)
    for _ in range(3):
        for n in (3, 5):
            for _ in range(3):
                x = torch.randn(n)
                torch.testing.assert_close(other(x), f(x))
    assert other.graphs.recorded() == 1


def test_records_the_bound_drops_are_freed_though_their_signatures_were_hot(device):
    """A hot path holds its record weakly: with one graph kept, five signatures made hot in turn
    leave one record alive, not five (a dropped graph's memory goes back to the pool)."""

    def f(x):
        return x.exp() + 1

    jitted = _graphed_jit(f, device, limit=1)
    records = []
    for n in range(1, 6):
        x = torch.randn(n)
        for _ in range(3):  # warm-up, capture, a replay by the key (which makes it hot)
            torch.testing.assert_close(jitted(x), f(x))
        records.append(weakref.ref(jitted._hot.record()))
    gc.collect()
    assert sum(r() is not None for r in records) == 1


def test_a_graphed_backward_under_retain_graph_runs_unreplayed():
    # a replay repeats its capture: one captured without retain_graph writes over the saved values
    # it donated, which the next backward reads; under the flag the backward runs itself, which
    # copies them (dispatch/donations.py `kept`)
    from minicomp.dispatch import graphed_calls

    calls = []
    replayed, run = (lambda args: calls.append("replay")), (lambda args: calls.append("run"))
    backward = graphed_calls._unreplayed_when_kept(replayed, run)

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            backward([])
            return grad * 2

    x = torch.randn(3, requires_grad=True)
    y = Doubled.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert calls == ["run", "replay"]
