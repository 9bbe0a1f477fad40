"""Issue #37, classes 8, 9, 11, 12: Python state a compile must not disturb or miss.

8   threads: a compile undoes only what its own trace changed, never another thread's writes
    (appends, `+=`, a dict's items, an object's attributes);
9   the function's own try/except: a value read while tracing is not an exception it can catch;
11  host reads: `.numpy()`, `.tolist()`, `__array__` of a traced tensor refuse the trace;
12  staleness: a rebound class method, changed defaults, an argument aliasing a closed-over tensor
    the function writes, and the first call's write into a global tensor (applied once).
"""

import functools
import importlib
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import minicomp
from minicomp.dispatch.entries import EagerEntry


def quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def dynamo(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="minicomp")


# -- 8. threads ----------------------------------------------------------------------------

SHARED = []
OWN = []


class _Turns:
    """The function hands a turn to the appending thread (which appends `burst` items) and waits
    for it: another thread's appends land in the middle of every trace, deterministically."""

    def __init__(self):
        self.go, self.done, self.stop, self.count, self.target = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
            0,
            None,
        )

    def take(self):
        self.done.clear()
        self.go.set()
        self.done.wait(5)

    def appender(self, burst=50):
        while not self.stop.is_set():
            if self.go.wait(0.01):
                self.go.clear()
                for _ in range(burst):
                    self.target.append(-1)
                    self.count += 1
                self.done.set()


TURNS = _Turns()
TAKE_TURN = functools.partial(_Turns.take, TURNS)  # a partial: not a helper whose state is watched


def reads_shared(x):
    TAKE_TURN()
    return x * (2 + 0 * len(SHARED))


def appends_own(x):
    OWN.append(x.shape[0])
    TAKE_TURN()
    return x * 2


@pytest.mark.parametrize("fn", [reads_shared, appends_own], ids=["reads", "appends"])
@pytest.mark.parametrize("module", [False, True], ids=["function", "module"])
def test_a_compile_keeps_another_threads_appends(fn, module):
    """Regression: a thread appending to a global list while a function reading (or appending to)
    that list compiled lost its appends: the trace's snapshot of the list was put back over them
    (of 324 appends, 256 were lost). A compile now undoes only what its own trace did."""
    SHARED.clear()
    OWN.clear()
    TURNS.target, TURNS.count = (SHARED if fn is reads_shared else OWN), 0
    TURNS.stop.clear()

    class Wrap(nn.Module):
        def forward(self, x):
            return fn(x)

    jitted = minicomp.jit(Wrap() if module else fn, fallback="silent")
    x = torch.randn(8, 4)
    thread = threading.Thread(target=TURNS.appender)
    thread.start()
    try:
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(jitted(x), x * 2)
    finally:
        TURNS.stop.set()
        thread.join()
    assert TURNS.count >= 150
    assert TURNS.target.count(-1) == TURNS.count
    if fn is appends_own:
        assert OWN.count(8) == 3  # once per call, no trace's leftover


class _Config:
    pass


TABLE, CONFIG = {}, _Config()


class _Writes(_Turns):
    """A turn writes `burst` times in one of several ways: a list's append, extend or `+=`, a
    dict's item, an object's attribute (each write a new key or item)."""

    how = "append"

    def appender(self, burst=50):
        while not self.stop.is_set():
            if self.go.wait(0.01):
                self.go.clear()
                for _ in range(burst):
                    self.count += 1
                    if self.how == "append":
                        SHARED.append(-1)
                    elif self.how == "extend":
                        SHARED.extend([-1])
                    elif self.how == "+=":
                        shared = SHARED
                        shared += [-1]
                    elif self.how == "dict":
                        TABLE[f"thread{self.count}"] = -1
                    else:
                        setattr(CONFIG, f"thread{self.count}", -1)
                self.done.set()


WRITES = _Writes()
WRITES_TURN = functools.partial(_Turns.take, WRITES)


def reads_all(x):
    WRITES_TURN()
    return x * (2 + 0 * len(SHARED) + 0 * len(TABLE) + 0 * len(vars(CONFIG)))


def writes_own(x):
    """Its own writes, each way (undone after its trace, then made once by the eager call)."""
    global SHARED
    SHARED += [x.shape[0]]
    TABLE["own"] = TABLE.get("own", 0) + 1
    CONFIG.own = getattr(CONFIG, "own", 0) + 1
    WRITES_TURN()
    return x * 2


@pytest.mark.parametrize("how", ["append", "extend", "+=", "dict", "attribute"])
@pytest.mark.parametrize("fn", [reads_all, writes_own], ids=["reads", "writes"])
@pytest.mark.parametrize("module", [False, True], ids=["function", "module"])
def test_a_compile_keeps_another_threads_writes(fn, how, module):
    """Regression: another thread's writes during a compile (a dict's item, an object's attribute)
    were put back with the trace's snapshot, and a function that only read the dict was refused.
    A compile now undoes only the trace's own writes (followed bytecode by bytecode: `+=`,
    `d[k] = v`, `obj.n = v`), and every write of the other thread stays."""
    SHARED.clear()
    TABLE.clear()
    vars(CONFIG).clear()
    WRITES.how, WRITES.count = how, 0
    WRITES.stop.clear()

    class Wrap(nn.Module):
        def forward(self, x):
            return fn(x)

    jitted = minicomp.jit(Wrap() if module else fn, fallback="silent")
    xs = [torch.randn(rows, 4) for rows in (8, 9, 10)]  # a compile each
    thread = threading.Thread(target=WRITES.appender)
    thread.start()
    try:
        with torch.no_grad():
            for x in xs:
                torch.testing.assert_close(jitted(x), x * 2)
                if fn is reads_all and not module:  # compiled: a read is no side effect (it writes in turns)
                    assert not isinstance(jitted.entry(x), EagerEntry)
    finally:
        WRITES.stop.set()
        thread.join()
    assert WRITES.count >= 150
    written = {
        "dict": sum(k.startswith("thread") for k in TABLE),
        "attribute": sum(k.startswith("thread") for k in vars(CONFIG)),
    }
    assert written.get(how, SHARED.count(-1)) == WRITES.count
    if fn is writes_own:  # once per call, no trace's leftover
        assert ([v for v in SHARED if v != -1], TABLE["own"], CONFIG.own) == ([8, 9, 10], 3, 3)


# -- 9. the function's own try/except ---------------------------------------------------------


def int_or_zero(x):
    try:
        n = int(x.sum())
    except Exception:  # noqa: BLE001 - the user's own catch-all
        return x * 0
    return x + n


def first_or_fallback(x, i):
    try:
        return x[i] * 2
    except IndexError:
        return x[0] * 3


def select_or_fallback(x, i):
    try:
        return torch.index_select(x, 0, i) * 2
    except (IndexError, RuntimeError):
        return x[:1] * 3


def indexes(x, i):
    with torch.no_grad():  # a with block is no try of the function's
        return x[i] * 2


def bare_except(x):
    try:
        flag = bool((x > 0).all())
    except:  # noqa: E722 - swallows anything, the trace's refusal too
        flag = False
    return x * 2 if flag else x * 3


def masked_or_all(x):
    try:
        return x[x > 0].sum() + 0 * x.sum()
    except Exception:  # noqa: BLE001
        return x.sum() * 0


@pytest.mark.parametrize("fn", [int_or_zero, bare_except, masked_or_all])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_value_read_inside_the_functions_try_is_not_its_except(fn, dtype, grad):
    """Regression: `int(x.sum())` inside `try: ... except Exception` raised the tracer's refusal
    (a stand-in has no values), the function caught it, and its except branch was compiled as
    the normal path: every call returned `x * 0`. A value read while tracing now raises what no
    `except Exception` catches, and one swallowed anyway (a bare except) still refuses."""
    x = (torch.rand(4, 3, dtype=dtype) + 0.5).requires_grad_(grad)
    jitted = minicomp.jit(fn, fallback="silent")
    for _ in range(2):
        torch.testing.assert_close(jitted(x), fn(x))
    assert all(isinstance(e, EagerEntry) for e in jitted.cache.values())


@pytest.mark.parametrize("fn", [first_or_fallback, select_or_fallback])
def test_an_index_error_the_function_catches_is_caught(fn):
    """Regression: `x[i]` inside the function's own `try: ... except IndexError` compiled, and an
    index out of range raised IndexError from the compiled code (eager's function caught it and
    returned `x[0] * 3`). Indexing by tensor values inside the function's own try block runs
    eagerly; outside one (or in a `with` block) it compiles."""
    x = torch.randn(5, 3)
    jitted = minicomp.jit(fn, fallback="silent")
    for i in (torch.tensor([2]), torch.tensor([9]), torch.tensor([1])):
        torch.testing.assert_close(jitted(x, i), fn(x, i))
    plain = minicomp.jit(indexes)
    torch.testing.assert_close(plain(x, torch.tensor([1, 3])), indexes(x, torch.tensor([1, 3])))
    assert not any(isinstance(e, EagerEntry) for e in plain.cache.values())


@pytest.mark.parametrize("fn", [int_or_zero, bare_except, first_or_fallback])
def test_a_value_read_inside_try_in_a_module_and_the_dynamo_backend(fn):
    class Wrap(nn.Module):
        def forward(self, *args):
            return fn(*args)

    args = (torch.rand(5, 3) + 0.5,) + ((torch.tensor([7]),) if fn is first_or_fallback else ())
    torch.testing.assert_close(quietly(minicomp.jit(Wrap(), fallback="silent"), *args), fn(*args))
    if fn is not first_or_fallback:  # (Dynamo itself, backend="eager" too, lets that IndexError out)
        torch.testing.assert_close(quietly(dynamo(fn), *args), fn(*args))


def indexes_in_try_finally(x, i):
    try:  # transformers wraps every model's forward in one: a cleanup, no catch
        return x[i] * 2
    finally:
        x.grad = None


def indexes_in_finally_that_returns(x, i):
    try:
        return x[i] * 2
    finally:
        return x[:1] * 3  # noqa: B012 - ends any exception, an IndexError too


def test_a_plain_finally_is_no_catch_and_one_that_returns_is():
    x = torch.randn(5, 3)
    plain = minicomp.jit(indexes_in_try_finally, fallback="raise")
    torch.testing.assert_close(plain(x, torch.tensor([1, 3])), indexes_in_try_finally(x, torch.tensor([1, 3])))
    assert not any(isinstance(e, EagerEntry) for e in plain.cache.values())
    returns = minicomp.jit(indexes_in_finally_that_returns, fallback="silent")
    for i in (torch.tensor([2]), torch.tensor([9])):
        torch.testing.assert_close(returns(x, i), indexes_in_finally_that_returns(x, i))
    assert all(isinstance(e, EagerEntry) for e in returns.cache.values())


def test_a_try_around_the_call_is_not_the_functions_own():
    """Regression: a module made only of torch's modules (nn.Sequential with an nn.Embedding)
    called inside the caller's try block was refused as "indexes by tensor values inside its own
    try block": the walk over the frames went past the tracer's into the caller's."""
    module = nn.Sequential(nn.Embedding(6, 3), nn.Linear(3, 2))
    jitted, i = minicomp.jit(module, fallback="raise"), torch.tensor([[0, 5], [2, 2]])
    try:
        out = jitted(i)
    except IndexError:  # the caller's own catch, around the call
        out = None
    torch.testing.assert_close(out, module(i))


# -- 11. host reads -----------------------------------------------------------------------------


def via_numpy(x):
    return x + float(x.numpy().sum())


def via_tolist(x):
    return x * x.tolist()[0][0]


def via_array(x):
    return x - float(np.asarray(x).max())


@pytest.mark.parametrize("fn", [via_numpy, via_tolist, via_array])
def test_host_reads_of_a_traced_tensor_run_eagerly(fn):
    """Regression: `.numpy()` of a stand-in read memory that held no values, and the garbage was
    baked into the compiled code. Such a read now refuses the trace (the call runs eagerly)."""
    jitted = minicomp.jit(fn, fallback="silent")
    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(jitted(x), fn(x))
    assert all(isinstance(e, EagerEntry) for e in jitted.cache.values())
    with pytest.raises(minicomp.CompileError, match="reads tensor values in Python"):
        minicomp.jit(fn, fallback="raise")(torch.randn(4, 3))


@pytest.mark.parametrize("fn", [via_numpy, via_array])
def test_host_reads_in_a_module(fn):
    class Wrap(nn.Module):
        def forward(self, x):
            return fn(x)

    jitted = minicomp.jit(Wrap(), fallback="silent")
    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(jitted(x), fn(x))


# -- 12. staleness ---------------------------------------------------------------------------------


class Scaled(nn.Module):
    def forward(self, x):
        return self.act(x)

    def act(self, x):
        return x * 2


def test_a_class_method_rebound_after_the_first_call_is_used():
    """Regression: `Scaled.act = ...` after the first call kept running the old method's code."""

    class Local(Scaled):
        pass

    module, x = Local(), torch.randn(4)
    jitted = minicomp.jit(module)
    torch.testing.assert_close(jitted(x), x * 2)
    Local.act = lambda self, x: x * 3
    torch.testing.assert_close(jitted(x), x * 3)


def test_a_method_called_through_self_rebound_is_used():
    class Holder:
        def run(self, x):
            return self.act(x) + 1

        def act(self, x):
            return x * 2

    holder, x = Holder(), torch.randn(4)
    jitted = minicomp.jit(holder.run)
    torch.testing.assert_close(jitted(x), x * 2 + 1)
    Holder.act = lambda self, x: x * 5
    torch.testing.assert_close(jitted(x), x * 5 + 1)


def test_changed_defaults_are_used():
    """Regression: `fn.__defaults__ = ...` after the first call kept the old default."""

    def scaled(x, k=2.0, *, shift=1.0):
        return x * k + shift

    x = torch.randn(4)
    jitted = minicomp.jit(scaled)
    torch.testing.assert_close(jitted(x), x * 2 + 1)
    scaled.__defaults__ = (3.0,)
    torch.testing.assert_close(jitted(x), x * 3 + 1)
    scaled.__kwdefaults__ = {"shift": 5.0}
    torch.testing.assert_close(jitted(x), x * 3 + 5)


def helper_with_default(x, k=2.0):
    return x * k


def calls_helper(x):
    return helper_with_default(x) + 1


def test_a_helpers_changed_defaults_are_used():
    x = torch.randn(4)
    jitted = minicomp.jit(calls_helper)
    torch.testing.assert_close(jitted(x), x * 2 + 1)
    helper_with_default.__defaults__ = (4.0,)
    try:
        torch.testing.assert_close(jitted(x), x * 4 + 1)
    finally:
        helper_with_default.__defaults__ = (2.0,)


def test_a_modules_forward_defaults_are_used():
    class WithDefault(nn.Module):
        def forward(self, x, k=2.0):
            return x * k

    x = torch.randn(4)
    jitted = minicomp.jit(WithDefault())
    torch.testing.assert_close(jitted(x), x * 2)
    WithDefault.forward.__defaults__ = (6.0,)
    torch.testing.assert_close(jitted(x), x * 6)


G = torch.zeros(4)


def bumps_global(x):
    G.add_(1)
    return x + G


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_the_first_call_writes_a_global_tensor_once(dtype):
    """Regression: the first call added 2 to `G` (`G.add_(1)`): once while tracing, once in the
    compiled code. Later calls added 1, as eager does."""
    global G
    G = torch.zeros(4, dtype=dtype)
    jitted = minicomp.jit(bumps_global, fallback="silent")
    x = torch.ones(4, dtype=dtype)
    for n in (1, 2, 3):
        torch.testing.assert_close(jitted(x), x + n)
        torch.testing.assert_close(G, torch.full((4,), n, dtype=dtype))


def test_the_first_call_writes_a_global_tensor_once_in_a_module():
    global G
    G = torch.zeros(4)

    class Bumps(nn.Module):
        def forward(self, x):
            return bumps_global(x)

    jitted, x = minicomp.jit(Bumps(), fallback="silent"), torch.ones(4)
    with torch.no_grad():
        for n in (1, 2):
            torch.testing.assert_close(jitted(x), x + n)
            torch.testing.assert_close(G, torch.full((4,), float(n)))


def test_an_argument_aliasing_a_written_global_sees_the_write():
    """Regression: called with the global it writes in place as its argument (`f(G)`), the
    compiled code read the argument as it was before the write: eager reads the new values."""
    global G
    G = torch.zeros(4)
    jitted = minicomp.jit(bumps_global, fallback="silent")
    jitted(torch.ones(4))  # compiled for this signature
    G.zero_()
    expected_G = G.clone() + 1
    out = jitted(G)
    torch.testing.assert_close(G, expected_G)
    torch.testing.assert_close(out, expected_G * 2)


# -- 8 (rollback). hooks a refused trace registered --------------------------------------------

HOOKED = []


class InstallsHooksOnce(nn.Module):
    """As transformers' output capturing: the first forward registers a forward hook on a
    submodule and sets a flag; a refused trace must undo both, or the eager run registers a second."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.installed = False

    def forward(self, x):
        if not self.installed:
            self.lin.register_forward_hook(lambda m, i, o: HOOKED.append(o))
            self.installed = True
        HOOKED.clear()
        y = self.lin(x)
        return torch.stack(HOOKED).sum(0) + y


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_hook_a_refused_trace_registered_is_removed(grad):
    model = InstallsHooksOnce()
    x = torch.randn(2, 4, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        out = minicomp.jit(model, fallback="silent")(x)
    assert len(model.lin._forward_hooks) == 1 and model.installed
    torch.testing.assert_close(out, model(x))  # the hook's output once, not twice


# -- 8 (false refusals). the import system's own state ------------------------------------------

modules = sys.modules  # as a library reads it: a global alias of the import system's table


def imports_lazily(x):
    # a lazy import adds to sys.modules (torch's own do while tracing): the function's reads of
    # that table are no state of its own, and the call compiles
    assert "sys" in modules
    importlib.import_module("minicomp_lazy_probe")
    return x * 2


def test_a_lazy_import_during_the_trace_is_no_side_effect(tmp_path, monkeypatch):
    (tmp_path / "minicomp_lazy_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "minicomp_lazy_probe", raising=False)
    x = torch.randn(3)
    jitted = minicomp.jit(imports_lazily, fallback="raise")
    torch.testing.assert_close(jitted(x), x * 2)
    assert not any(isinstance(e, EagerEntry) for e in jitted.cache.values())
