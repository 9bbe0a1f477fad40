"""Python's cyclic collector paused while minicomp compiles (gc_pause.py): off inside a compile, on
again after it (also when it fails), left off where the user had switched it off, kept off until
the last of overlapping compiles in several threads ends; config "pause_gc" turns it off."""

import gc
import threading

import pytest
import torch

import minicomp
from minicomp import config, gc_pause


@pytest.fixture(autouse=True)
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_paused_inside_and_on_after_also_on_an_error():
    with gc_pause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_pause.paused():
        raise RuntimeError("a compile that fails")
    assert gc.isenabled()
    with gc_pause.paused(enabled=False):
        assert gc.isenabled()


def test_a_collector_the_user_switched_off_stays_off():
    gc.disable()
    with gc_pause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_compiles_in_threads_keep_it_paused_until_the_last_ends():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with gc_pause.paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with gc_pause.paused():
            second_in.set()
            first_out.wait(5)
            seen["after the first ended"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after the first ended": False}
    assert gc.isenabled()


def test_a_jit_compile_runs_with_the_collector_paused(monkeypatch):
    """Paused while jit traces the function and while the pipeline plans it; not with the option off."""
    from minicomp import capture
    from minicomp.plan import fusion

    states = []
    real_trace, real_plan = capture.trace, fusion.plan
    monkeypatch.setattr(
        capture, "trace", lambda *a, **k: states.append(("trace", gc.isenabled())) or real_trace(*a, **k)
    )
    monkeypatch.setattr(fusion, "plan", lambda *a, **k: states.append(("plan", gc.isenabled())) or real_plan(*a, **k))
    x = torch.randn(6, 5)
    torch.testing.assert_close(minicomp.jit(lambda t: (t * 2).relu())(x), (x * 2).relu())
    assert states == [("trace", False), ("plan", False)] and gc.isenabled()
    states.clear()
    with config.override(pause_gc=False):
        torch.testing.assert_close(minicomp.jit(lambda t: (t * 3).sigmoid())(x), (x * 3).sigmoid())
    assert states == [("trace", True), ("plan", True)]


def test_a_torch_compile_backend_call_and_a_new_size_run_with_the_collector_paused(monkeypatch):
    """Paused in the backend call before any pipeline runs (its chunked-loss rewrite; AOTAutograd's
    traces) and where a dynamic graph is made concrete for a new size (outside `compile_graph`)."""
    from minicomp.capture import specialize
    from minicomp.dispatch import chunk_tracing, dynamo

    states = []
    real_rewrite, real_concrete = chunk_tracing.dynamo_graph, specialize.concrete

    def rewrite(*args, **kwargs):
        states.append(("backend", gc.isenabled()))
        return real_rewrite(*args, **kwargs)

    def concrete(*args, **kwargs):
        states.append(("new size", gc.isenabled()))
        return real_concrete(*args, **kwargs)

    monkeypatch.setattr(chunk_tracing, "dynamo_graph", rewrite)
    monkeypatch.setattr(specialize, "concrete", concrete)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: (t * 2).relu().sum(-1), backend=dynamo.backend, dynamic=True)
    for rows in (3, 4):
        x = torch.randn(rows, 5)
        torch.testing.assert_close(fn(x), (x * 2).relu().sum(-1))
    torch._dynamo.reset()
    assert ("backend", False) in states and ("new size", False) in states
    assert all(not on for _, on in states) and gc.isenabled()


def test_a_child_forked_during_a_compile_starts_with_no_pause():
    with gc_pause.paused():
        gc_pause._after_fork_in_child()  # what os.fork runs in the child
        assert gc.isenabled() and gc_pause._depth == 0
        gc.disable()  # (the parent's pause goes on: restore its state for this process)
        gc_pause._depth = 1
    assert gc.isenabled() and gc_pause._depth == 0
