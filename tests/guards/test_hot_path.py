"""The hot path (dispatch/hot_path.py): the signature a jitted function last ran, checked in C++
before its key. A repeated call skips the key; every change the key would see takes the keyed way
and gets the result eager gives."""

from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.dispatch import hot_path

pytestmark = pytest.mark.skipif(hot_path.TensorGuards is None, reason="this torch has no C++ tensor guards")


def _keyed(monkeypatch, jitted) -> list:
    """Appends one item per call that took the keyed way."""
    calls = []
    real = jitted._key
    monkeypatch.setattr(jitted, "_key", lambda *a: calls.append(1) or real(*a))
    return calls


def scaled_sum(x, y, s):
    return (x * s + y).relu() if s is not None else (x + y).relu()


def test_a_repeated_call_skips_the_key(device, monkeypatch):
    jitted = minicomp.jit(scaled_sum, fallback="raise")
    x, y = torch.randn(6, 5, device=device), torch.randn(6, 5, device=device)
    for _ in range(2):
        jitted(x, y, 2)
    keyed = _keyed(monkeypatch, jitted)
    for _ in range(3):
        x, y = torch.randn(6, 5, device=device), torch.randn(6, 5, device=device)  # new values, same signature
        torch.testing.assert_close(jitted(x, y, 2), scaled_sum(x, y, 2))
    assert keyed == []
    assert jitted.compiles == 1


def _changes():
    """(name, the arguments of a call unlike `(x, y, 2)`, the mode it runs under)."""
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    no_mode = torch.enable_grad
    return [
        ("a number", (x, y, 3), no_mode),
        ("a number's type", (x, y, 2.0), no_mode),
        ("None", (x, y, None), no_mode),
        ("a tensor for a number", (x, y, torch.tensor(2.0)), no_mode),
        ("a list for a number", (x, y, [2]), no_mode),
        ("fewer arguments", (x, y), no_mode),
        ("inference mode", (x, y, 2), torch.inference_mode),
    ]


def _tensor_changes():
    """(name, a function of the first argument `x` of the hot call giving one unlike it)."""
    return [
        ("shape", lambda x: x[:1]),
        ("strides", lambda x: x.t().contiguous().t()),
        ("dtype", lambda x: x.double()),
        ("requires_grad", lambda x: x.clone().requires_grad_()),
        ("a parameter", lambda x: torch.nn.Parameter(x.clone())),
        ("a negative view", lambda x: x._neg_view()),
        ("device", lambda x: x.to("meta")),
    ]


def _f(x, y, s=None):
    if isinstance(s, list):
        s = s[0]
    return scaled_sum(x, y, s)


def _g(x, y):
    return scaled_sum(x, y, None)


def _hot(number: bool, device="cpu"):
    """A jitted `_f` whose signature (two [6, 5] tensors and the number 2), or `_g` (the tensors
    only), is hot."""
    jitted = minicomp.jit(_f if number else _g, fallback="silent")  # (a negative view runs eagerly)
    base = (torch.randn(6, 5, device=device), torch.randn(6, 5, device=device), 2)[: 3 if number else 2]
    for _ in range(2):
        jitted(*base)
    assert jitted._hot is not None
    return jitted, base


@pytest.mark.parametrize("name,args,mode", _changes(), ids=[c[0] for c in _changes()])
def test_each_change_takes_the_keyed_way(monkeypatch, name, args, mode):
    jitted, _ = _hot(number=True)
    keyed = _keyed(monkeypatch, jitted)
    with mode():
        got = jitted(*args)
        want = _f(*args)
    assert keyed == [1]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("number", [True, False], ids=["and a number", "tensors only"])
@pytest.mark.parametrize("name,unlike", _tensor_changes(), ids=[c[0] for c in _tensor_changes()])
def test_each_tensor_change_takes_the_keyed_way(device, monkeypatch, name, unlike, number):
    jitted, base = _hot(number, device)
    keyed = _keyed(monkeypatch, jitted)
    x = unlike(base[0])
    args = (x, *base[1:]) if name != "device" else (x, base[1].to("meta"), *base[2:])
    got = jitted(*args)
    assert keyed == [1]
    if name == "device":
        assert got.device.type == "meta" and got.shape == (6, 5)
    else:
        torch.testing.assert_close(got, jitted.fn(*args))


def test_a_mode_change_takes_the_keyed_way(monkeypatch):
    """The global modes the key holds: grad mode with an input that requires grad, the default
    dtype a factory function reads."""

    def f(x):
        return x * torch.ones(x.shape[-1]).to(x.dtype).sum() + torch.ones(()).double().to(x.dtype)

    jitted = minicomp.jit(f)
    x = torch.randn(4, 3)
    for _ in range(2):
        jitted(x)
    keyed = _keyed(monkeypatch, jitted)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.testing.assert_close(jitted(x), f(x))
    finally:
        torch.set_default_dtype(old)
    assert keyed == [1]
    w = x.clone().requires_grad_()
    for _ in range(2):
        with torch.no_grad():
            jitted(w)
    keyed.clear()
    out = jitted(w)  # grad on: a training signature
    assert keyed == [1] and out.requires_grad


SCALE = 2.0


def reads_a_global(x):
    return x * SCALE


def test_a_global_it_reads_takes_the_keyed_way(monkeypatch):
    global SCALE
    jitted = minicomp.jit(reads_a_global)
    x = torch.randn(5)
    for _ in range(2):
        jitted(x)
    keyed = _keyed(monkeypatch, jitted)
    SCALE = 3.0
    try:
        torch.testing.assert_close(jitted(x), x * 3.0)
    finally:
        SCALE = 2.0
    assert keyed == [1]


def test_keyword_arguments_take_the_keyed_way(monkeypatch):
    jitted = minicomp.jit(scaled_sum)
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(2):
        jitted(x, y, 2)
    keyed = _keyed(monkeypatch, jitted)
    torch.testing.assert_close(jitted(x, y, s=2), scaled_sum(x, y, 2))
    assert keyed == [1]


def test_a_signature_forgotten_is_not_kept_hot():
    jitted = minicomp.jit(scaled_sum)
    jitted.cache_limit = 1
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(2):
        jitted(x, y, 2)
    first = jitted._hot.entry
    jitted(torch.randn(4), torch.randn(4), 2)  # compiles; the first signature is forgotten
    assert jitted._hot is None or jitted._hot.entry is not first
    assert first not in jitted.cache.values()
    torch.testing.assert_close(jitted(x, y, 2), scaled_sum(x, y, 2))  # compiled again
    assert jitted.compiles == 3


def test_a_nested_tensor_where_a_tensor_was_runs_eagerly():
    """(torch's C++ tensor guards abort the process on a nested tensor: it is refused before them)"""
    jitted, _ = _hot(number=False)
    x = torch.nested.nested_tensor([torch.randn(5), torch.randn(5)])
    got = jitted(x, x)
    for a, b in zip(got.unbind(), _g(x, x).unbind()):
        torch.testing.assert_close(a, b)


def test_a_hot_path_made_from_a_parameter_is_made_again_for_tensors(monkeypatch):
    """A signature first called with a Parameter (the key does not tell it from a tensor, the C++
    check does) serves later calls with plain tensors from the next call on."""
    jitted = minicomp.jit(scaled_sum)
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(2):
        jitted(torch.nn.Parameter(x.clone(), requires_grad=False), y, 2)
    keyed = _keyed(monkeypatch, jitted)
    for _ in range(4):
        torch.testing.assert_close(jitted(x, y, 2), scaled_sum(x, y, 2))
    assert keyed == [1] and jitted.compiles == 1


def test_entries_that_check_their_arguments_first_are_always_keyed():
    """An entry that writes into an input (its aliasing checked per call), a training signature and
    a signature run eagerly never go hot; nor does a jitted module (its state is read each call)."""

    def add_into(out, x):
        out.add_(x)
        return out

    written = minicomp.jit(add_into)
    out, x = torch.zeros(4), torch.ones(4)
    for _ in range(3):
        written(out, x)
    torch.testing.assert_close(out, torch.full((4,), 3.0))
    training = minicomp.jit(scaled_sum)
    w = torch.randn(3, requires_grad=True)
    for _ in range(3):
        training(w, torch.randn(3), 2).sum().backward()
    eager = minicomp.jit(scaled_sum, fallback="silent")
    neg = torch.randn(3)._neg_view()
    for _ in range(3):
        eager(neg, neg, 2)
    module = minicomp.jit(torch.nn.Linear(3, 2))
    with torch.no_grad():
        for _ in range(3):
            module(torch.randn(4, 3))
    assert written._hot is None and training._hot is None and eager._hot is None
    assert module.compiled._hot is None


def test_signatures_in_turn_each_hot_once_made():
    """Two signatures in turn: each call takes the keyed way and makes its own entry hot (the hot
    path of each entry is made once)."""
    jitted = minicomp.jit(scaled_sum)
    a = (torch.randn(3), torch.randn(3), 2)
    b = (torch.randn(4), torch.randn(4), 2)
    made = []
    real = hot_path.HotPath.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    hot_path.HotPath.__init__ = counting
    try:
        for _ in range(4):
            for args in (a, b):
                torch.testing.assert_close(jitted(*args), scaled_sum(*args))
    finally:
        hot_path.HotPath.__init__ = real
    assert len(made) == 2
