"""Issue #37, messages: what minicomp refuses or cannot run is said in one clean line, and nothing
of its machinery (PyTorch's internal asserts or logs, numpy warnings of Triton's interpreter)
reaches the user."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import minicomp

ROOT = Path(__file__).resolve().parents[2]


# -- an in-place write into a tensor the function closes over ------------------------------

W = torch.zeros(4)


def add_(x):
    W.add_(x)
    return x * 2


def add_constant(x):
    W.add_(1)  # a write that reads no input: traced, it would happen once, never on a compiled call
    return x * 2


def copy_(x):
    W.copy_(x)
    return x * 2


def setitem(x):
    W[1:3] = x[:2]
    return x + 1


def out_kwarg(x):
    torch.add(x, 1, out=W)
    return x * 2


def iadd(x):
    global W
    W += x
    return x - 1


def chained(x):
    W.mul_(2).add_(x)
    return W * 2


def relu_inplace(x):
    torch.nn.functional.relu(W, inplace=True)
    return x * W


WRITERS = [add_, add_constant, copy_, setitem, out_kwarg, iadd, chained, relu_inplace]


def _eager_twice(fn, x):
    W.copy_(torch.tensor([-1.0, 0.5, 2.0, -3.0]))
    outs = [fn(x.clone()) for _ in range(2)]
    return outs, W.clone()


@pytest.mark.parametrize("fn", WRITERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_in_place_write_to_a_global_tensor_is_refused_in_one_clean_line(fn, dtype):
    global W
    W = torch.zeros(4, dtype=dtype)
    x = torch.arange(4, dtype=dtype) + 1
    expected, expected_w = _eager_twice(fn, x)
    W.copy_(torch.tensor([-1.0, 0.5, 2.0, -3.0]))
    jitted = minicomp.jit(fn, fallback="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [jitted(x.clone()) for _ in range(2)]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(W, expected_w)  # each call wrote it, as eager does
    said = [str(w.message) for w in caught if "minicomp" in str(w.message)]
    assert len(said) == 1 and len(said[0].splitlines()) == 1, said
    assert "INTERNAL ASSERT" not in said[0] and "closes over" in said[0], said[0]
    with pytest.raises(minicomp.CompileError, match="closes over") as raised:
        minicomp.jit(fn, fallback="raise")(x.clone())
    assert "INTERNAL ASSERT" not in str(raised.value)


@pytest.mark.parametrize("fn", [add_, copy_, iadd], ids=lambda f: f.__name__)
def test_an_in_place_write_to_a_global_tensor_under_torch_compile(fn):
    global W
    W = torch.zeros(4)
    x = torch.arange(4.0) + 1
    expected, expected_w = _eager_twice(fn, x)
    W.copy_(torch.tensor([-1.0, 0.5, 2.0, -3.0]))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="minicomp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [compiled(x.clone()) for _ in range(2)]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(W, expected_w)
    assert not [w for w in caught if "INTERNAL ASSERT" in str(w.message)]


# -- an op eager refuses: eager's error, once, without PyTorch's log ------------------------

BOOL_SUB = """
    import warnings, torch, minicomp
    warnings.simplefilter("always")
    a = torch.tensor({a})
    b = torch.tensor({b})
    try:
        minicomp.jit(lambda a, b: {expr})(a, b)
    except Exception as err:
        print("raised", type(err).__name__)
"""


@pytest.mark.parametrize(
    "a, b, expr",
    [
        ("[True, False]", "[True, True]", "a - b"),
        ("[[True], [False]]", "[[True, False]]", "torch.sub(a, b) * 2"),
        ("[True, False]", "[True, True]", "(a & b) - a"),
        ("[True, False, True]", "True", "a - b"),
    ],
)
def test_bool_minus_bool_shows_eagers_error_once_and_no_torch_log(tmp_path, a, b, expr):
    script = textwrap.dedent(BOOL_SUB.format(a=a, b=b, expr=expr))
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
        MINICOMP_FALLBACK="warn",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("MINICOMP_LOGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "raised RuntimeError", done.stdout + done.stderr
    assert "fake_tensor" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("Subtraction, the `-` operator, with two bool tensors") <= 1, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # a warning and its source line, at most


# -- numpy's warnings from Triton's interpreter ------------------------------------------


def _no_runtime_warnings(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # over pytest's filterwarnings
        result = run()
    numpy_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not numpy_warnings, [f"{w.filename}: {w.message}" for w in numpy_warnings]
    return result


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.exp(x) * torch.log(x),  # log of negatives: nan, as eager
        lambda x: x / (x - x),  # 0/0 and x/0
        lambda x: torch.sqrt(x).sum(-1),  # a reduction over a row shorter than its block
        lambda x: torch.exp(x * 100),
    ],
    ids=["log", "divide", "sum_sqrt", "exp_overflow"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_no_numpy_warning_from_the_interpreter_reaches_the_user(fn, dtype):
    x = torch.randn(7, 37).to(dtype)
    got = _no_runtime_warnings(lambda: minicomp.jit(fn)(x))
    torch.testing.assert_close(got, fn(x), equal_nan=True, atol=2e-2, rtol=2e-2)


def test_no_numpy_warning_under_torch_compile():
    fn = lambda x: torch.log(x) / (x - x)  # noqa: E731
    x = torch.randn(5, 33)
    torch._dynamo.reset()
    got = _no_runtime_warnings(lambda: torch.compile(fn, backend="minicomp")(x))
    torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_no_numpy_warning_in_a_subprocess_without_pytests_filters(tmp_path):
    script = "import torch, minicomp\nx = torch.randn(100)\nminicomp.jit(lambda x: torch.log(x) / (x - x))(x)\n"
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "RuntimeWarning" not in done.stderr, done.stderr


def test_a_symbolic_size_is_named_for_what_it_is():
    """A size that depends on tensor values (an unbacked symbol: nonzero) is reported so; any
    other symbolic size reaching the IR is not (it was called data-dependent too: an "unhashable
    SymInt" anywhere in the pipeline read as one)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import ir

    def values(gm):
        return [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]

    backed = values(make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(4, 3)))[-1]
    unbacked = values(make_fx(torch.nonzero, tracing_mode="symbolic")(torch.randn(4, 3)))[-1]
    with pytest.raises(ir.SymbolicSize, match="symbolic size") as raised:
        ir.TensorMeta.of(backed)
    assert not raised.value.data_dependent
    with pytest.raises(ir.SymbolicSize, match="depends on tensor values") as raised:
        ir.TensorMeta.of(unbacked)
    assert raised.value.data_dependent
    with pytest.raises(minicomp.CompileError, match="depends on tensor values"):
        minicomp.jit(lambda x: torch.nonzero(x) + 1, fallback="raise")(torch.randn(8))
