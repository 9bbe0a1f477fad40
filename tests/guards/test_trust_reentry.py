"""Issue #37, reentrancy: a jitted function called on the thread that is running another kernel in
Triton's interpreter (from a signal handler, a GC callback, a `__del__`) never deadlocks: it runs
eagerly, with eager's result. Each scenario runs in a subprocess with a timeout (a deadlock fails
the test instead of hanging it)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
    import gc, signal, sys, torch, minicomp
    torch.manual_seed(0)
    BIG = torch.randn(6_000_000)  # a kernel the interpreter runs for ~0.6 s
    small = torch.randn(8)
    got = []

    def long_running(x):
        return torch.sin(x) * 2 + torch.cos(x)

    outer = ({outer})(long_running)
    outer(torch.randn(6_000_000))  # compiled before the long call
"""

INNER = {
    "same_function": ("outer", "long_running(small)"),
    "compiled_function": ("minicomp.jit(lambda x: x * 3 + 1)", "small * 3 + 1"),
    "first_call": ("minicomp.jit(lambda x: torch.relu(x) - 2)", "torch.relu(small) - 2"),
    "dynamo": ('torch.compile(lambda x: x * 3 - 1, backend="minicomp")', "small * 3 - 1"),
    "int_dtype": ("minicomp.jit(lambda x: (x * 7) // 2)", "(small.long() * 7) // 2"),
    "training": ("minicomp.jit(lambda x: (x * 2).sin().sum())", "(small * 2).sin().sum()"),
}
ARGS = {"int_dtype": "small.long()", "training": "small.clone().requires_grad_()"}

SIGNAL = """
    def handler(signum, frame):
        got.append(torch.equal(inner(ARG), EXPECTED))

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    out = outer(BIG)
    signal.setitimer(signal.ITIMER_REAL, 0)
"""

GC_CALLBACK = """
    armed = [True]

    def during_gc(phase, info):
        if armed[0] and phase == "start":
            armed[0] = False
            got.append(torch.equal(inner(ARG), EXPECTED))

    gc.collect()
    gc.callbacks.append(during_gc)
    out = outer(BIG)
    gc.callbacks.remove(during_gc)
"""

DEL = """
    class Dropped:
        def __del__(self):
            got.append(torch.equal(inner(ARG), EXPECTED))

    def cycle():
        a = Dropped()
        a.me = a  # freed by the collector, which the interpreter's allocations run

    gc.collect()
    cycle()
    out = outer(BIG)
"""

CHECK = """
    assert torch.allclose(out, torch.sin(BIG) * 2 + torch.cos(BIG), atol=1e-5)
    print("ran", len(got), all(got))
"""


def _script(outer: str, inner: str, expected: str, arg: str, how: str) -> str:
    body = textwrap.dedent(PRELUDE.format(outer=outer))
    body += f"inner = {inner}\nARG = {arg}\nEXPECTED = {expected}\n"
    if inner != "outer" and "relu" not in inner:  # compiled before, unless it is the first call
        body += "inner(ARG.clone())\n"
    body += textwrap.dedent(how) + textwrap.dedent(CHECK)
    return body


def _run(script: str, tmp_path) -> str:
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
        MINICOMP_FALLBACK="raise",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a jitted call made while another kernel was interpreted never returned")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("which", list(INNER))
def test_a_signal_handler_calling_a_jitted_function_during_an_interpreted_launch(tmp_path, which):
    inner, expected = INNER[which]
    arg = ARGS.get(which, "small")
    script = _script("minicomp.jit", inner, expected, arg, SIGNAL)
    assert _run(script, tmp_path) == "ran 1 True"


@pytest.mark.parametrize("how", [GC_CALLBACK, DEL], ids=["gc_callback", "__del__"])
def test_a_gc_callback_or_finalizer_calling_a_jitted_function_during_an_interpreted_launch(tmp_path, how):
    inner, expected = INNER["compiled_function"]
    assert _run(_script("minicomp.jit", inner, expected, "small", how), tmp_path) == "ran 1 True"


def test_the_outer_call_can_be_a_torch_compile_graph(tmp_path):
    inner, expected = INNER["same_function"]
    script = _script('lambda f: torch.compile(f, backend="minicomp")', "outer", expected, "small", SIGNAL)
    assert _run(script, tmp_path) == "ran 1 True"
