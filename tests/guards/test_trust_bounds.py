"""Issue #37, class 10: an index out of range raises as in eager, where a kernel reads through it
(gather, cross_entropy's target, a one-hot scatter, F.one_hot's value), by a device-side check in
the kernel: on the CPU evaluated by the interpreter and raised as eager's error, on CUDA compiled
in (as Inductor's) and failing as eager's CUDA kernels do. Each function is compiled on valid
indices first, so the bad ones reach the compiled kernel."""

import functools

import pytest
import torch
import torch.nn.functional as F

import minicomp
import minicomp.dispatch.dynamo


def _compiled_then_raises(fn, good: tuple, bad: tuple, compiled=None):
    compiled = compiled or minicomp.jit(fn)
    torch.testing.assert_close(compiled(*good), fn(*good))
    with pytest.raises((IndexError, RuntimeError)):
        fn(*bad)
    with pytest.raises((IndexError, RuntimeError)):
        compiled(*bad)
    torch.testing.assert_close(compiled(*good), fn(*good))  # and right again after


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bad_value", [5, -1, 2**32 + 1])
def test_gather_index_out_of_bounds_raises(dtype, bad_value):
    if dtype == torch.int32 and bad_value > 2**31:
        pytest.skip("not an int32")
    x = torch.randn(4, 5)
    good = torch.tensor([[0], [4], [1], [2]], dtype=dtype).long()
    bad = good.clone()
    bad[1, 0] = bad_value
    _compiled_then_raises(lambda x, i: x.gather(1, i) * 2, (x, good), (x, bad))


def test_gather_along_a_transposed_input_raises():
    x = torch.randn(4, 5)
    good = torch.tensor([[0, 1, 4, 3]])
    bad = torch.tensor([[0, 1, 7, 3]])
    _compiled_then_raises(lambda x, i: torch.gather(x.t(), 0, i.t()) + 1, (x, good), (x, bad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad_value", [5, -3, 2**32 + 1])
def test_cross_entropy_target_out_of_bounds_raises(dtype, bad_value):
    x = torch.randn(4, 5).to(dtype)
    good = torch.tensor([0, 4, -100, 2])  # -100: ignore_index, allowed
    bad = good.clone()
    bad[1] = bad_value
    _compiled_then_raises(lambda x, t: F.cross_entropy(x, t), (x, good), (x, bad))


def test_cross_entropy_in_a_looped_row_raises():
    x = torch.randn(3, 5000)
    good, bad = torch.tensor([0, 4999, 7]), torch.tensor([0, 5000, 7])
    _compiled_then_raises(lambda x, t: F.cross_entropy(x, t, reduction="none"), (x, good), (x, bad))


def test_cross_entropy_training_target_out_of_bounds_raises():
    x = torch.randn(4, 5, requires_grad=True)
    good, bad = torch.tensor([0, 4, 1, 2]), torch.tensor([0, 9, 1, 2])
    fn = lambda x, t: F.cross_entropy(x, t)  # noqa: E731
    compiled = minicomp.jit(fn)
    loss = compiled(x, good)
    loss.backward()
    torch.testing.assert_close(loss, fn(x, good))
    with pytest.raises((IndexError, RuntimeError)):
        compiled(x, bad).backward()


def test_one_hot_scatter_out_of_bounds_raises():
    good, bad = torch.tensor([[0], [2], [4]]), torch.tensor([[0], [5], [4]])
    _compiled_then_raises(lambda i: torch.zeros(3, 5).scatter(1, i, 1.0) * 2, (good,), (bad,))


def test_gather_out_of_bounds_raises_through_the_backend():
    x = torch.randn(4, 5)
    good = torch.tensor([[0], [4], [1], [2]])
    bad = torch.tensor([[0], [4], [6], [2]])
    fn = lambda x, i: x.gather(1, i) * 2  # noqa: E731
    _compiled_then_raises(fn, (x, good), (x, bad), compiled=torch.compile(fn, backend=minicomp.dispatch.dynamo.backend))


def test_indexing_and_embedding_raise_through_aten():
    x = torch.randn(4, 5)
    _compiled_then_raises(lambda x, i: x[i] + 1, (x, torch.tensor([0, 3])), (x, torch.tensor([0, 2**32 + 1])))
    _compiled_then_raises(lambda w, i: F.embedding(i, w) + 1, (x, torch.tensor([0, 3])), (x, torch.tensor([0, 4])))


# -- F.one_hot: ATen's one_hot skips its value checks on a traced tensor (an `eq` with an arange) --
@pytest.mark.parametrize("bad_value", [5, -1, 2**32 + 1])
@pytest.mark.parametrize("shape", [(3,), (2, 3)], ids=["1d", "2d"])
def test_one_hot_value_out_of_range_raises(shape, bad_value):
    """Regression: a value outside [0, num_classes) gave a row of zeros (eager raises)."""
    good = torch.arange(3).remainder(5).expand(shape).contiguous()
    bad = good.clone()
    bad.view(-1)[1] = bad_value
    fn = lambda i: F.one_hot(i, 5).float() * 2  # noqa: E731
    _compiled_then_raises(fn, (good,), (bad,))
    _compiled_then_raises(lambda i: F.one_hot(i, num_classes=5) + i.unsqueeze(-1), (good,), (bad,))


def test_one_hot_value_out_of_range_raises_in_training_and_through_the_backend():
    x = torch.randn(3, 5, requires_grad=True)
    good, bad = torch.tensor([0, 2, 4]), torch.tensor([0, 7, 4])
    fn = lambda x, i: (x * F.one_hot(i, 5)).sum()  # noqa: E731
    _compiled_then_raises(fn, (x, good), (x, bad))
    dynamo = torch.compile(fn, backend=minicomp.dispatch.dynamo.backend)
    _compiled_then_raises(fn, (x, good), (x, bad), compiled=dynamo)


def test_one_hot_in_a_dynamo_graph_keeps_its_check(monkeypatch):
    """On a GPU, Dynamo's graph holds F.one_hot itself (on the CPU its value check breaks the
    graph), and AOTAutograd traced it to an `eq` with an arange: a value out of range gave a row
    of zeros. The backend hands such a graph the checked form (closed_over.with_checked_forms)."""
    from minicomp.capture.closed_over import with_checked_forms

    monkeypatch.setenv("MINICOMP_FALLBACK", "raise")  # compiled by minicomp, not run as captured
    gm = torch.fx.symbolic_trace(lambda i: (F.one_hot(i, 5).float() * 2,))  # Dynamo's graphs return tuples
    assert any(node.target is F.one_hot for node in gm.graph.nodes)
    assert not any(node.target is F.one_hot for node in with_checked_forms(gm).graph.nodes)
    good, bad = torch.tensor([0, 2, 4]), torch.tensor([0, 7, 4])
    compiled = minicomp.dispatch.dynamo.backend(gm, [good])
    torch.testing.assert_close(compiled(good), gm(good))
    with pytest.raises((IndexError, RuntimeError)):
        compiled(bad)


def test_one_hot_forms_eager_decides_stay_eager():
    """num_classes=-1 (read from the values) and a non-int64 index keep eager's behaviour."""
    i = torch.tensor([0, 3, 1])
    jit = functools.partial(minicomp.jit, fallback="silent")
    torch.testing.assert_close(jit(lambda i: F.one_hot(i) * 2)(i), F.one_hot(i) * 2)
    with pytest.raises(RuntimeError, match="LongTensor"):
        jit(lambda i: F.one_hot(i, 4))(i.int())


# -- CUDA kernels: the same bounds checks, compiled in (checked=True: Triton's debug option) -------
def _cuda_source(fn, *args) -> str:
    """The module minicomp writes for fn(*args) as if the tensors were on CUDA (traced on the CPU,
    the graph's devices then set to cuda:0): codegen only, nothing runs."""
    import dataclasses

    from torch.utils import _pytree as pytree

    from minicomp import capture, ir
    from minicomp.codegen import render_module
    from minicomp.plan import fusion

    traced = capture.trace(fn, list(args), pytree.tree_flatten((args, {}))[1], [f"a{i}" for i in range(len(args))])
    graph = ir.from_fx(traced.gm, traced.input_names)
    for name in graph.order:
        node = graph[name]
        if isinstance(node.meta, ir.TensorMeta):
            node.meta = dataclasses.replace(node.meta, device=torch.device("cuda:0"))
    return render_module(fusion.plan(graph), "fn").text


@pytest.mark.parametrize(
    "fn,args",
    [
        (lambda x, t: F.cross_entropy(x, t), (torch.randn(4, 5), torch.tensor([0, 4, -100, 2]))),
        (lambda x, i: x.gather(1, i) * 2, (torch.randn(4, 5), torch.tensor([[0], [4], [1], [2]]))),
        (lambda i: F.one_hot(i, 5).float() * 2, (torch.tensor([0, 2, 4]),)),
    ],
    ids=["cross_entropy", "gather", "one_hot"],
)
def test_cuda_kernels_that_read_an_index_assert_it(fn, args):
    """As Inductor's: `tl.device_assert(0 <= idx < size)` under the lanes' mask in the kernel that
    reads through an index from tensor data, whose launch compiles it in (checked=True); a failed
    one is CUDA's device-side assert, as eager's CUDA kernels give."""
    source = _cuda_source(fn, *args)
    launches = [line for line in source.splitlines() if " = Launch(" in line]
    checked = [line for line in launches if line.endswith(", checked=True)")]
    assert source.count("tl.device_assert(") == len(checked) >= 1
    assert "mask=" in next(line for line in source.splitlines() if "tl.device_assert(" in line)
    assert len(checked) < len(launches) or len(launches) == 1  # kernels without an index read stay as they were


def test_cuda_kernels_do_not_check_division():
    """Eager's CUDA kernels return a value for an integer division by zero: no assert, no debug build."""
    source = _cuda_source(lambda a, b: a // b + a % b, torch.tensor([4, 5]), torch.tensor([1, 2]))
    assert "tl.device_assert(" not in source and "checked=True" not in source


def test_checked_launch_compiles_with_asserts_and_no_overflow_checks():
    from minicomp.runtime import checks
    from minicomp.runtime.launch import Launch
    from minicomp.runtime.launch_spec import PointwiseLaunch

    cuda = Launch(lambda: None, PointwiseLaunch(numel=16), device="cuda:0", checked=True)
    plain = Launch(lambda: None, PointwiseLaunch(numel=16), device="cuda:0")
    assert cuda.settings(16, 4) == {"BLOCK_SIZE": 16, "num_warps": 4, **checks.COMPILE_OPTIONS}
    assert checks.COMPILE_OPTIONS == {"debug": True, "sanitize_overflow": False}
    assert "debug" not in plain.settings(16, 4)


_CUDA_PROBE = """
import sys, torch, torch.nn.functional as F, minicomp
logits = lambda: (torch.randn(4, 5, device="cuda"),)
cases = {
    "gather": (lambda x, i: x.gather(1, i) * 2, logits, [[0], [4], [1], [2]], [[0], [4], [9], [2]]),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), logits, [0, 4, -100, 2], [0, 5, 1, 2]),
    "one_hot": (lambda t: F.one_hot(t, 5).float() * 2, lambda: (), [0, 2, 4], [0, 7, 4]),
}
fn, make, good, bad = cases[sys.argv[1]]
import minicomp.dispatch.dynamo  # the backend as an object: a source tree run has no entry point
wrap = minicomp.jit if sys.argv[2] == "jit" else (lambda f: torch.compile(f, backend=minicomp.dispatch.dynamo.backend))
compiled, args = wrap(fn), make()
good, bad = torch.tensor(good, device="cuda"), torch.tensor(bad, device="cuda")
torch.testing.assert_close(compiled(*args, good), fn(*args, good))
compiled(*args, good)
torch.cuda.synchronize()
print("GOOD", flush=True)
compiled(*args, bad)
torch.cuda.synchronize()
print("NO ASSERT", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("how", ["jit", "compile"])
@pytest.mark.parametrize("case", ["gather", "cross_entropy", "one_hot"])
def test_cuda_index_out_of_bounds_asserts_on_the_device(case, how):
    """On a GPU an index out of range stops the kernel with a device-side assert (as eager's CUDA
    kernels do), where it read other memory or a zero before. A failed assert leaves the CUDA
    context unusable, so each case runs in its own process."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _CUDA_PROBE, case, how], capture_output=True, text=True, timeout=600)
    assert "GOOD" in run.stdout, run.stderr[-3000:]
    assert "NO ASSERT" not in run.stdout and run.returncode != 0
    assert "device-side assert" in run.stderr or "index out of bounds" in run.stderr, run.stderr[-3000:]
