"""Issue #17: the first trace of a plain function runs on meta stand-ins (meta_trace.py), not
make_fx, so a cold process loads no torch._dynamo. What it cannot take goes to make_fx: the same
results either way."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp import ir
from minicomp.capture import functional, meta_trace, tracing


def traced_both_ways(fn, *args):
    """The IR of fn's graph from the stand-in tracer and from make_fx, and their Outputs."""
    leaves, spec = list(args), tracing.pytree.tree_flatten((args, {}))[1]
    slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    standin_gm, standin_outputs, _ = tracing._trace_on_standins(fn, leaves, spec, slots)
    make_fx_gm, make_fx_outputs, _ = tracing._trace_with_make_fx(fn, leaves, spec, slots)
    graphs = [ir.from_fx(functional.functional_temporaries(gm)) for gm in (standin_gm, make_fx_gm)]
    return graphs, (standin_outputs, make_fx_outputs)


def _ops(graph) -> list[tuple]:
    """Each op node's target and result meta, in order (names differ between the tracers; an
    alias is the value it aliases, which the stand-in tracer records as such)."""
    skipped = ("input", torch.ops.aten.alias.default)
    return [(str(n.target), n.meta) for n in graph.nodes.values() if n.target not in skipped]


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def swiglu(a, b):
    return F.silu(a) * b


def in_place_temporary(x, b):
    y = x + b
    y.mul_(2)  # a value the trace made, written before anything read it
    return y.relu_()


def cast_and_factory(x):
    return x.to(torch.float64) + torch.ones(x.shape[-1], device=x.device) + torch.arange(x.shape[-1], device=x.device)


def cpu_scalar_tensor(x):
    return x * torch.tensor(2.0) + x.new_zeros(()) + x.cpu().sum().to(x.device)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda x, b: torch.relu(x + 0.5 * x * b + b), [(8, 16), (16,)]),
        (rms_norm, [(4, 32), (32,)]),
        (lambda x: torch.softmax(x, -1), [(4, 32)]),
        (lambda x, w, b: F.layer_norm(x, (32,), w, b), [(4, 32), (32,), (32,)]),
        (rope, [(2, 8, 16), (8, 16), (8, 16)]),
        (swiglu, [(4, 32), (4, 32)]),
        (in_place_temporary, [(4, 8), (8,)]),
        (cast_and_factory, [(3, 5)]),
        (cpu_scalar_tensor, [(3, 5)]),
        (lambda x: (x.sum(0), x.amax(-1), x.var(-1)), [(6, 10)]),
        (lambda x: F.gelu(x.t().contiguous(), approximate="tanh"), [(6, 10)]),
    ],
)
def test_the_standin_graph_is_make_fx_graph(fn, shapes, device):
    args = [torch.randn(s, device=device) for s in shapes]
    (standin, make_fx), (standin_out, make_fx_out) = traced_both_ways(fn, *args)
    assert _ops(standin) == _ops(make_fx)
    assert standin_out.records == make_fx_out.records


def _compiles_on_standins(fn, *args, caplog):
    """Compile and run fn; whether make_fx traced it (the graph log says why it did)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minicomp.graph"):
        result = minicomp.jit(fn, fallback="raise")(*args)
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("traced with make_fx")]
    return result, refused


def test_a_plain_function_compiles_on_standins(caplog):
    x, b = torch.randn(8, 16), torch.randn(16)
    result, refused = _compiles_on_standins(lambda x, b: torch.relu(x + b), x, b, caplog=caplog)
    assert refused == []
    torch.testing.assert_close(result, torch.relu(x + b))


def write_input(x):
    x.add_(1)
    return x * 2


def branch_on_values(x):
    return x * 2 if x.sum() > 0 else x - 1


def returns_views(x):
    return x[1:], x.t(), x


def keeps_a_tensor_across_calls(x):
    KEPT.append(x * 2)
    return x + 1


KEPT: list = []


@pytest.mark.parametrize(
    "fn, why",
    [
        (write_input, "writes into an argument"),
        (lambda x: x.unsqueeze_(0) + 1, "shape in place"),
        (lambda x: (x + 1).unsqueeze_(0) * 2, "shape in place"),
        (lambda x: x * torch.rand_like(x), "random"),
        (lambda x: torch.nonzero(x), "reads tensor values"),
    ],
)
def test_what_stand_ins_cannot_take_goes_to_make_fx(fn, why, caplog):
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="minicomp.graph"):
        try:
            minicomp.jit(fn, fallback="warn")(x)
        except Exception:  # noqa: BLE001 - only the reason it left the stand-ins is checked here
            pass
    assert any("traced with make_fx" in r.getMessage() and why in r.getMessage() for r in caplog.records)


def test_values_read_in_python_leave_the_standins_and_run_eagerly(caplog):
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="branches on tensor values"):
        result, refused = _compiles_on_standins_default(branch_on_values, x, caplog=caplog)
    assert refused == []  # refused by both tracers: make_fx is not tried
    torch.testing.assert_close(result, branch_on_values(x))


def _compiles_on_standins_default(fn, *args, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minicomp.graph"):
        result = minicomp.jit(fn, fallback="warn")(*args)
    return result, [r.getMessage() for r in caplog.records if r.getMessage().startswith("traced with make_fx")]


def test_returned_views_alias_their_argument_as_in_eager(caplog):
    x = torch.randn(4, 6)
    (tail, transposed, same), refused = _compiles_on_standins(returns_views, x, caplog=caplog)
    assert refused == []
    assert same is x and tail.data_ptr() == x[1:].data_ptr() and transposed.stride() == (1, 6)
    tail.fill_(3.0)
    assert bool((x[1:] == 3.0).all())  # writes through, as eager's view does


def test_a_tensor_kept_from_a_trace_is_refused_and_put_back():
    """A trace that appends to a global list is undone and the call runs eagerly, once."""
    KEPT.clear()
    f = minicomp.jit(keeps_a_tensor_across_calls, fallback="warn")
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="changes"):
        f(x)
    f(x)
    assert len(KEPT) == 2 and all(type(t) is torch.Tensor for t in KEPT)


LOG: list = []


def logs_then_reads_a_value(x):
    LOG.append(1)
    return x * 2 if x.sum() > 0 else x


def test_a_trace_failing_part_way_leaves_its_side_effects_to_eager():
    """A trace that appended to a global and then failed (a value read: both tracers refuse it)
    was not undone, so the fallback's eager run appended a second time."""
    LOG.clear()
    with pytest.warns(UserWarning):
        minicomp.jit(logs_then_reads_a_value, fallback="warn")(torch.randn(3))
    assert LOG == [1]


def test_torch_dynamo_disable_is_kept_once_dynamo_loads():
    """meta_trace fills torch._disable_dynamo's cache slot with `_DisabledOnceLoaded`; once
    torch._dynamo is loaded it calls exactly `torch._dynamo.disable(fn)`."""

    calls = []
    deferred = meta_trace._DisabledOnceLoaded(lambda v: calls.append(v) or v, True)
    assert deferred(3) == 3 and calls == [3]
    assert deferred.disabled is not None and deferred.disabled._torchdynamo_disable


COLD = textwrap.dedent("""
    import sys, torch
    import torch.nn.functional as F
    import minicomp
    device = sys.argv[1]
    x, w = torch.randn(8, 32, device=device), torch.randn(32, device=device)
    fns = [
        lambda x, w: torch.relu(x + 0.5 * x * w + w),
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
        lambda x, w: F.layer_norm(x, (32,), w) + torch.softmax(x, -1),
    ]
    for fn in fns:
        torch.testing.assert_close(minicomp.jit(fn, fallback="raise")(x, w), fn(x, w))
    heavy = ("torch._dynamo", "torch._inductor", "functorch")
    print(" ".join(m for m in heavy if m in sys.modules) or "none")
""")


def test_a_cold_process_compiles_without_loading_dynamo(tmp_path, device):
    """Issue #17: make_fx imports torch._dynamo and torch._inductor (about 0.9 s of a cold
    process's first call); a compile on stand-ins loads neither."""
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path))
    command = [sys.executable, "-c", COLD, device.type]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "none", run.stdout


def test_integer_indexing_stays_on_standins_and_a_mask_does_not(caplog):
    x, rows = torch.randn(6, 4), torch.tensor([4, 0, 4])
    result, refused = _compiles_on_standins(lambda x, i: x[i] * 2, x, rows, caplog=caplog)
    assert refused == []
    torch.testing.assert_close(result, x[rows] * 2)
    result, refused = _compiles_on_standins_default(lambda x: x[x > 0] * 2, x, caplog=caplog)
    assert refused and "reads tensor values" in refused[0]
    torch.testing.assert_close(result, x[x > 0] * 2)


def detach_then_write(x):
    y = x * 2
    kept = y.detach()  # decomposes to an alias: the write below must reach it
    y.add_(1)
    return kept, y


def test_a_write_into_a_value_with_an_alias_goes_to_make_fx(caplog):
    x = torch.randn(3, 4)
    (kept, y), refused = _compiles_on_standins(detach_then_write, x, caplog=caplog)
    assert refused and "already read" in refused[0]
    torch.testing.assert_close(kept, x * 2 + 1)
    torch.testing.assert_close(y, x * 2 + 1)


INNER = minicomp.jit(lambda x: x * 3)


def test_a_jitted_function_called_inside_the_trace_is_its_code(caplog, recwarn):
    x = torch.randn(3, 4)
    result, refused = _compiles_on_standins(lambda x: INNER(x) + 1, x, caplog=caplog)
    assert refused == [] and len(recwarn) == 0
    torch.testing.assert_close(result, x * 3 + 1)
