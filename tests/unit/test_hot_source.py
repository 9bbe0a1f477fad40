"""A hot path written out for its signature (dispatch/hot_source.py): the replay inline hands out
each kind of output as graph_outputs.OutputPlan does, reads inputs in place or from buffers, moves
what a caller kept, misses on anything the record does not hold; on the CPU with the stand-in graph
of test_graphs.py."""

from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp import guards
from minicomp.dispatch import hot_path, hot_source
from minicomp.dispatch.hot_path import MISS, HotPath
from minicomp.runtime.graphs import Graphs
from tests.unit.test_graphs import FakeDevice, _boxed, _graphed_jit, needs_moves

pytestmark = pytest.mark.skipif(hot_path.TensorGuards is None, reason="this torch has no C++ tensor guards")


class _Entry:
    """What HotPath reads of a jit entry: every argument goes in, the outputs come back as a list."""

    slots = None
    unflatten = staticmethod(list)
    outputs = None
    hot = None


def _hot_over(graphed, args: list) -> HotPath:
    """The hot path of `graphed` (replayed once by its Graphed already) for calls like `args`."""
    key = (len(args), tuple(map(guards.leaf_key, args)), guards.global_state(), None)
    entry = _Entry()
    entry.graphed = graphed
    return HotPath(None, key, args, entry, graphed)


def _every_kind(w, y, scale):
    """Outputs of each kind: an input read in place (and a view of it: aliases), a view of an input
    read in place while it stays, two views of one memory of the graph, an empty tensor, a number."""
    z = y * scale
    return [w, w[1:], y[2:], z.view(2, 4), z[::2], torch.empty(0), scale]


@needs_moves
def test_the_written_replay_hands_out_every_kind_of_output():
    device = FakeDevice()
    graphed = Graphs(limit=4, rerecords=2, device=device).wrap(_boxed(_every_kind), "every", static=[0], fixed=True)
    w, y = torch.randn(5), torch.randn(8)
    for _ in range(3):  # warm-up, capture, a replay
        graphed([w, y, 3.0])
    hot = _hot_over(graphed, [w, y, 3.0])
    source = hot.source
    for part in (".detach()", "a1.as_strided((6,), (1,), a1.storage_offset() + 2)", "empty_strided", "on_4(s0)"):
        assert part in source
    replays = device.graphs[0].replays
    kept = []
    for _ in range(3):
        w.copy_(torch.randn(5))
        y.copy_(torch.randn(8))
        got = hot.call((w, y, 3.0), None)
        expected = _every_kind(w.clone(), y.clone(), 3.0)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert got[0].data_ptr() == w.data_ptr() and got[2].data_ptr() == y.data_ptr() + 2 * 4
        assert got[4].data_ptr() == got[3].data_ptr()  # (views of one memory stay views of one another)
        kept.append((got[3], expected[3]))  # kept across calls: moved out before the next replay
    assert device.graphs[0].replays == replays + 3
    for got, expected in kept:
        torch.testing.assert_close(got, expected)


def test_the_written_hot_path_misses_where_the_record_does_not_serve():
    """A moved static input, a number of another value, another count: MISS, nothing replayed."""
    device = FakeDevice()
    graphed = Graphs(limit=4, rerecords=2, device=device).wrap(_boxed(_every_kind), "every", static=[0], fixed=True)
    w, y = torch.randn(5), torch.randn(8)
    for _ in range(3):
        graphed([w, y, 3.0])
    hot = _hot_over(graphed, [w, y, 3.0])
    replays = device.graphs[0].replays
    assert hot.call((w.clone(), y, 3.0), None) is MISS
    assert hot.call((w, y, 2.0), None) is MISS
    assert hot.call((w, y), None) is MISS
    assert hot.call((w, y.double(), 3.0), None) is MISS
    assert device.graphs[0].replays == replays
    graphed.refuse("a test")
    assert hot.call((w, y, 3.0), None) is MISS


def _two(x0, x1):
    return (x1 * x0).sin()


def _six(x0, x1, x2, x3, x4, x5):
    return ((x1 + x2 + x3 + x4 + x5) * x0).sin()


@pytest.mark.parametrize("f", [_two, _six])
def test_many_inputs_read_in_place_and_one_from_a_buffer(f):
    """Inputs read in place, fewer or more than the written check unrolls, and one copied into a
    buffer (a new tensor each call): each call's values, served by the hot path."""
    count = f.__code__.co_argcount
    assert (count - 1 > hot_source._MANY_ADDRESSES) == (f is _six)
    jitted = _graphed_jit(f, FakeDevice())
    xs = [torch.randn(4) for _ in range(count)]
    for _ in range(6):  # warm-up, capture, moved (x0 copied from now on), capture, replays
        xs[0] = torch.randn(4)
        torch.testing.assert_close(jitted(*xs), f(*xs))
    hot = jitted._hot
    assert "copy_inputs(record.buffers" in hot.source
    in_one_call = count - 1 > hot_source._MANY_ADDRESSES and hot_source._same_ptrs is not None
    assert ("same_ptrs(" in hot.source) == in_one_call
    keyed = []
    real = jitted._key
    jitted._key = lambda *a: keyed.append(1) or real(*a)
    for _ in range(3):
        xs[0] = torch.randn(4)
        for x in xs[1:]:
            x.copy_(torch.randn(4))
        torch.testing.assert_close(jitted(*xs), f(*xs))
    assert keyed == []


def test_a_jitted_functions_hot_path_is_written_without_graphs():
    jitted = minicomp.jit(lambda x, s: (x * s).relu(), fallback="raise")
    x = torch.randn(6)
    for _ in range(2):
        jitted(x, 2)
    assert "return entry(fn, args, 2)" in jitted._hot.source and "leaf_key(a1) != key_1" in jitted._hot.source
    torch.testing.assert_close(jitted._hot.call((x, 2), None), (x * 2).relu())
    assert jitted._hot.call((x, 3), None) is MISS


def test_a_function_named_beyond_ascii_gets_a_hot_path():
    def f(x):
        return x + 1

    f.__name__ = "f²-ä"  # (any string: '²' is a digit to str.isalnum, not a character of names)
    jitted = minicomp.jit(f, fallback="raise")
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(jitted(x), x + 1)
    assert jitted._hot is not None and jitted._hot.source.startswith("def hot_f___(")


@pytest.mark.parametrize("name", ["f\x00", None, "class", "1"])
def test_any_name_gets_a_hot_path(name):
    """A callable's `__name__` is any object: the written function's name is made of its letters."""

    class Call:
        def __call__(self, x):
            return x * 2

    fn = Call()
    fn.__name__ = name
    jitted = minicomp.jit(fn, fallback="raise")
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(jitted(x), x * 2)
    assert jitted._hot is not None


def test_a_hot_path_made_again_reuses_its_code():
    """A Parameter and a tensor in turn (one key: the C++ guards tell them apart, so each call makes
    the entry's hot path again): the written function is compiled once."""
    jitted = minicomp.jit(lambda x: x + 1, fallback="raise")
    p, t = torch.nn.Parameter(torch.randn(3), requires_grad=False), torch.randn(3)
    with torch.no_grad():
        jitted(p)
        codes = set()
        for _ in range(3):
            for x in (p, t):
                torch.testing.assert_close(jitted(x), x + 1)
                codes.add(id(jitted._hot.code))
    assert len(codes) == 1 and jitted.compiles == 1


def test_a_plan_that_copies_its_outputs_copies_its_inputs_once(monkeypatch):
    """(a torch that can neither move a held output nor mark it: the generic replay, its inputs
    copied there alone)"""
    from minicomp.runtime import graph_outputs
    from minicomp.runtime import graphs as cuda_graphs

    monkeypatch.setattr(graph_outputs, "_moves", False)
    monkeypatch.setattr(graph_outputs, "_poison", None)
    copies = []
    real = cuda_graphs.copy_inputs

    def counted(buffers, args):
        copies.append(1)
        return real(buffers, args)

    monkeypatch.setattr(cuda_graphs, "copy_inputs", counted)
    monkeypatch.setattr(hot_source, "copy_inputs", counted)
    jitted = _graphed_jit(_two, FakeDevice())
    y = torch.randn(4)
    for _ in range(5):  # warm-up, capture, moved (x copied from then on), capture, a replay
        x = torch.randn(4)
        torch.testing.assert_close(jitted(x, y), _two(x, y))
    assert "replay_recorded" in jitted._hot.source
    copies.clear()
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(jitted(x, y), _two(x, y))
    assert copies == [1, 1, 1]
