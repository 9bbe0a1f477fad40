"""A dynamic graph written at a probe size before its first size (capture/specialize.py `probe_args`),
so the kernel families its first size starts are widened there, not at the next size (issue #42)."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.capture import specialize
from minicomp.codegen import families
from minicomp.runtime.size_classes import bucket


@pytest.mark.parametrize("n, probe", [(1023, 1007), (1024, 1008), (40, 56), (33, 49), (500, 484), (17, 17), (2, 2)])
def test_a_probe_size_is_sixteen_away_in_the_same_bucket(n, probe):
    assert specialize.probe_value(n) == probe


def test_every_probe_keeps_the_residue_mod_16_and_the_bucket():
    for n in range(2, 5000):
        p = specialize.probe_value(n)
        assert p == n or (abs(p - n) == 16 and p >= 2 and bucket(p) == bucket(n)), n
    assert sum(specialize.probe_value(n) != n for n in range(2, 5000)) > 4900  # (only the smallest have none)


def test_probe_args_lay_the_inputs_out_at_the_probe_values():
    def f(x, y):
        return (x.t() @ y).sum(-1)

    x, y = torch.randn(40, 3), torch.randn(40, 5)
    gm = make_fx(f, tracing_mode="symbolic")(x, y)
    assert specialize.is_dynamic(gm)
    probed = specialize.probe_args(gm, [x, y])
    assert [tuple(a.shape) for a in probed] == [(56, 3), (56, 5)]
    assert [a.stride() for a in probed] == [(3, 1), (5, 1)]
    static, positions = specialize.substituted(gm, probed)
    assert positions == [0, 1]
    values = [n.meta["val"] for n in static.graph.nodes if n.op == "call_function" and "val" in n.meta]
    assert any(tuple(v.shape) == (3, 56) for v in values)  # (x.t() at the probe's rows)


def test_no_probe_where_no_size_can_move():
    gm = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(5, 3))
    assert specialize.probe_args(gm, [torch.randn(5, 3)]) is None  # (5 - 16 < 2; 21 is in another bucket)


def _rows(x, w):
    return torch.softmax(x * w, dim=0), (x.t() * w[:, None]).sum(-1)


def _compile_counting(monkeypatch, probe: bool):
    """_rows through torch.compile, and {"made", "widened"}: the families started and widened."""
    from minicomp.dispatch.dynamo import backend

    counts = {"made": 0, "widened": 0}
    widen, init = families.Family.widen, families.Family.__init__

    def counting_widen(self, literals):
        counts["widened"] += 1
        return widen(self, literals)

    def counting_init(self, *args, **kwargs):
        counts["made"] += 1
        init(self, *args, **kwargs)

    torch._dynamo.reset()  # (a function's families are kept with its frame: start them anew)
    monkeypatch.setattr(families.Family, "widen", counting_widen)
    monkeypatch.setattr(families.Family, "__init__", counting_init)
    return torch.compile(_rows, backend=backend, options={"probe_sizes": probe}), counts


@pytest.mark.parametrize("probe", [True, False])
def test_the_third_size_writes_no_new_text_after_a_probe(monkeypatch, probe):
    """At 64 rows (a power of two) the column reductions have no mask; the dynamic graph's first size
    (63) starts families of its own. With the probe (47) they are widened at 63 and 62 finds their
    template; without it, 62 widens them: new Triton text, a compile on a GPU."""
    compiled, counts = _compile_counting(monkeypatch, probe)
    after = {}
    for rows in (64, 63, 62, 61):
        counts.update(made=0, widened=0)
        x, w = torch.randn(rows, 16), torch.randn(16)
        for got, expected in zip(compiled(x, w), _rows(x, w)):
            torch.testing.assert_close(got, expected)
        after[rows] = dict(counts)
    assert after[61] == {"made": 0, "widened": 0}
    if probe:
        assert after[63]["widened"] > 0 and after[62] == {"made": 0, "widened": 0}
    else:
        assert after[62]["widened"] > 0  # (what the probe saves)


def test_a_later_size_equal_to_the_probe_is_served_the_template(monkeypatch):
    """The probe's kernels are never compiled: a real size equal to the probe size (47 after
    64, 63) takes the family's template, not the probe member's literal text (a compile)."""
    compiled, counts = _compile_counting(monkeypatch, True)
    for rows in (64, 63, 62, 47):
        counts.update(made=0, widened=0)
        x, w = torch.randn(rows, 16), torch.randn(16)
        for got, expected in zip(compiled(x, w), _rows(x, w)):
            torch.testing.assert_close(got, expected)
    assert counts == {"made": 0, "widened": 0}


def test_the_probe_times_no_matmul(monkeypatch):
    """At a probe size, a padding or template choice that no record holds is not timed on the
    GPU (config "measure_matmuls" off while it is written): the shapes may be of a class the
    real sizes never reach."""
    from minicomp import config
    from minicomp.dispatch import dynamo

    seen = []
    write_graph = dynamo.write_graph

    def spying(*args, **kwargs):
        seen.append((config.get("measure_matmuls"), kwargs.get("probe")))
        return write_graph(*args, **kwargs)

    monkeypatch.setattr(dynamo, "write_graph", spying)
    torch._dynamo.reset()
    compiled = torch.compile(_rows, backend=dynamo.backend)
    for rows in (64, 63):
        x, w = torch.randn(rows, 16), torch.randn(16)
        compiled(x, w)
    assert seen == [(False, True)]


def test_an_unmeasured_padding_choice_is_no_padding(monkeypatch, tmp_path):
    """No record and "measure_matmuls" off: not padded, nothing timed."""
    from minicomp import config
    from minicomp.runtime import matmul_timing

    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))

    def timed(*_):
        raise AssertionError("timed")

    monkeypatch.setattr(matmul_timing, "_matmul", timed)
    monkeypatch.setattr(matmul_timing, "_key", lambda *parts: "key")  # (the real one names the GPU)
    plain = (((64, 50257), (50257, 1)), ((50257, 64), (64, 1)))
    padded = (((64, 50264), (50264, 1)), ((50264, 64), (64, 1)))
    with config.override(measure_matmuls=False):  # (with it on, this would time: `_matmul` raises)
        assert matmul_timing.padding_pays("mm", torch.bfloat16, torch.device("cpu"), plain, padded, []) is False


def test_a_first_size_too_small_to_probe_leaves_the_probe_for_a_later_one(monkeypatch):
    """At 10 rows no size can move (-6; 26 lies in another bucket): no probe, and the probe is
    still there for the next size that can take one (63)."""
    from minicomp.dispatch import dynamo

    probed = []
    write_graph = dynamo.write_graph
    monkeypatch.setattr(dynamo, "write_graph", lambda *a, **k: probed.append(a[0]) or write_graph(*a, **k))
    torch._dynamo.reset()
    compiled = torch.compile(_rows, backend=dynamo.backend)
    sizes = []
    for rows in (9, 10, 63, 62):
        x, w = torch.randn(rows, 16), torch.randn(16)
        for got, expected in zip(compiled(x, w), _rows(x, w)):
            torch.testing.assert_close(got, expected)
        sizes.append(len(probed))
    assert sizes == [0, 0, 1, 1]
    [x] = [n for n in probed[0].graph.nodes if n.op == "placeholder" and n.meta["val"].dim() == 2]
    assert tuple(x.meta["val"].shape) == (47, 16)


def test_a_probe_the_graph_cannot_take_is_skipped(caplog):
    """A probe size a size check of the graph refuses (its `_assert_scalar` on rows > 60, at the
    probe's 47) is logged and skipped; the sizes compile and run as they would without it."""
    from minicomp.dispatch.dynamo import backend

    def checked(x):
        torch._check(x.shape[0] > 60)
        return x * 2

    compiled = torch.compile(checked, backend=backend)
    with caplog.at_level("INFO", "minicomp.recompiles"):
        for rows in (64, 63, 62):
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x), x * 2)
    assert "no probe size (RuntimeError: Runtime assertion failed for expression" in caplog.text
