"""Shared fixtures: the device under test, a private cache dir, eager comparison.

Markers (registered in pyproject.toml): `gpu` for a test that needs CUDA (the `device` fixture's
"cuda" case carries it; a test that uses CUDA without the fixture is marked by hand), skipped
where there is no CUDA; `slow` for a test of several seconds or more (a subprocess, a build).
`pytest -m gpu` runs every CUDA test, `-m "not gpu"` the CPU ones, `-m "not slow"` skips the long ones.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

os.environ["MINICOMP_FALLBACK"] = "raise"  # a compile failure is a test failure, never a silent eager run

import minicomp  # noqa: E402


def _backend_by_name() -> None:
    """`torch.compile(backend="minicomp")` finds minicomp through its installed entry point; a
    source tree run without installing (the GPU machine: PYTHONPATH=.) registers it here."""
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "minicomp" not in list_backends(exclude_tags=()):
        from minicomp.dispatch.dynamo import backend

        register_backend(name="minicomp")(backend)


_backend_by_name()
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # the same test ids with or without a GPU


def pytest_collection_modifyitems(config, items):
    """The `slow` tests first (`make test` hands tests to pytest-xdist's workers a few at a time,
    so the short ones fill in around the long ones, not after them); a `gpu` test is skipped where
    there is no CUDA (so `-m gpu` lists the same tests everywhere)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # (stable: the rest in order)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    os.environ["MINICOMP_CACHE_DIR"] = str(tmp_path_factory.mktemp("minicomp-cache"))
    yield


@pytest.fixture(params=DEVICES)
def device(request):
    """Every test that takes `device` runs on CPU (Triton's interpreter) and on CUDA (marked `gpu`)."""
    return torch.device(request.param)


def kernel_count(source: str) -> int:
    """Kernels a module launches (its @triton.jit combine helpers are not kernels); a launcher bound
    to an alike kernel's (`launch_2 = launch_0`, codegen/alike.py) is a launch of its own."""
    return len(re.findall(r"^launch_\d+ = (?:Launch\(|launch_\d+\b)", source, flags=re.M))


def kernel_text(source: str) -> list[str]:
    """The Triton kernels of a module (what Triton compiles and keys its cache on)."""
    return re.findall(r"^@triton\.jit(?:\([^\n]*\))?\ndef mc_.*?(?=^launch_)", source, flags=re.M | re.S)


def aten_call(source: str, op: str = "") -> bool:
    """Whether generated `source` runs an ATen op whose name starts with `op` ("mm", "index_put",
    "" for any) as an ATen call: through `torch.ops.aten.<op>...` or through torch's Python binding,
    whose line names the op in a trailing `# binding of aten.<op>...` (codegen/aten_bindings.py)."""
    return re.search(r"(torch\.ops\.aten\.|  # binding of aten\.)" + re.escape(op), source) is not None


def tolerance(dtype: torch.dtype) -> dict:
    """Fused code keeps float32 between ops where eager rounds each op to 16 bits."""
    return {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}.get(dtype, {})


def check(fn, *args, kernels: int | None = None, **kwargs):
    """Run fn eagerly and through minicomp on copies of args; compare everything.

    Compares outputs, and inputs afterwards too (so in-place effects are checked).
    Returns the compiled source so a test can look at it.
    """
    clone = lambda a: a.clone() if isinstance(a, torch.Tensor) else a  # noqa: E731
    eager_args, jit_args = [clone(a) for a in args], [clone(a) for a in args]
    expected = fn(*eager_args, **kwargs)
    compiled = minicomp.jit(fn)
    actual = compiled(*jit_args, **kwargs)
    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), torch.float32)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance(dtype))
    except AssertionError:
        if dtype not in (torch.float16, torch.bfloat16):
            raise
        no_worse_than_eager(fn, args, kwargs, actual, expected, dtype)
    for a, b in zip(jit_args, eager_args):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True, **tolerance(dtype))
    source = compiled.source(*[clone(a) for a in args], **kwargs)
    if kernels is not None:
        assert kernel_count(source) == kernels, source
    return source


def no_worse_than_eager(fn, args, kwargs, actual, expected, dtype):
    """16-bit results judged against eager on float32 copies: eager rounds each op to 16 bits and
    minicomp rounds once, so where eager cancels (q * cos + rotated * sin) the two may differ by
    more than the tolerance while minicomp is the closer. Each element of minicomp may be off the
    float32 result by no more than eager's own error plus the tolerance."""
    up = lambda a: a.detach().float() if isinstance(a, torch.Tensor) and a.dtype == dtype else a  # noqa: E731
    reference = fn(*[up(a) for a in args], **kwargs)
    tol = tolerance(dtype)
    for got, want, ref in zip(_tensors(actual), _tensors(expected), _tensors(reference)):
        ref = ref.float()
        allowed = (want.float() - ref).abs() + tol["atol"] + tol["rtol"] * ref.abs()
        error = (got.float() - ref).abs()
        assert bool(((error <= allowed) | (ref.isnan() & got.isnan())).all()), (
            f"off the float32 result by {(error - allowed).max().item()} more than eager and the tolerance"
        )


def _tensors(value) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def graph_of(fn, *args):
    """The IR graph (minicomp.ir) of `fn` traced on `args`, its inputs named a0, a1, ..."""
    from torch.utils import _pytree as pytree

    from minicomp import capture, ir

    names = [f"a{i}" for i in range(len(args))]
    traced = capture.trace(fn, list(args), pytree.tree_flatten((args, {}))[1], names)
    return ir.from_fx(traced.gm, traced.input_names)


def ops_of(graph) -> list[str]:
    """The op names of `graph`'s computed nodes, in order."""
    return [graph[n].op_name for n in graph.order if not graph[n].is_input]


def grads_match(fn, *args, grad_of=None):
    """Forward + backward through eager and minicomp; compare outputs and input grads.

    With 16-bit inputs the reference is eager on float32 copies: minicomp computes in float32
    and rounds at each store, while eager in 16 bits rounds every intermediate, and a rounded
    intermediate near zero can fall on the other side of a ReLU (a whole seed value of
    gradient apart: `lora_epilogue` did, about one run in twenty)."""
    grad_of = grad_of if grad_of is not None else [i for i, a in enumerate(args) if a.is_floating_point()]
    widen = lambda a: a.float() if a.dtype in (torch.float16, torch.bfloat16) else a  # noqa: E731
    eager = [widen(a).detach().clone().requires_grad_(i in grad_of) for i, a in enumerate(args)]
    mine = [a.detach().clone().requires_grad_(i in grad_of) for i, a in enumerate(args)]
    compiled = minicomp.jit(fn)
    outs_e, outs_m = fn(*eager), compiled(*mine)
    outs_e = outs_e if isinstance(outs_e, tuple) else (outs_e,)
    outs_m = outs_m if isinstance(outs_m, tuple) else (outs_m,)
    seeds = [torch.randn_like(o) for o in outs_m]
    sum((o.float() * s.float()).sum() for o, s in zip(outs_e, seeds)).backward()
    sum((o.float() * s.float()).sum() for o, s in zip(outs_m, seeds)).backward()
    tol = tolerance(args[0].dtype)
    for a, b in zip(outs_m, outs_e):
        torch.testing.assert_close(widen(a), b, **tol)
    # gradients of broadcast inputs are sums of 16-bit gradients: allow more there
    grad_tol = dict(atol=5e-2, rtol=5e-2) if args[0].dtype == torch.bfloat16 else tol
    for i in grad_of:
        torch.testing.assert_close(widen(mine[i].grad), eager[i].grad, **grad_tol)
    return compiled.entry(*mine)


@pytest.fixture
def module_sources():
    """The text of each module minicomp generates meanwhile, as compiled (the output_code channel),
    with Dynamo's caches reset before and after."""
    import logging

    texts: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            texts.append(record.getMessage())

    logger, handler = logging.getLogger("minicomp.output_code"), Keep()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    torch._dynamo.reset()
    yield texts
    logger.removeHandler(handler)
    logger.setLevel(level)
    torch._dynamo.reset()


@pytest.fixture
def dynamo_compiles(monkeypatch):
    """The names of the graphs minicomp's Dynamo backend compiles meanwhile (a pipeline run
    each), in order, with Dynamo's caches reset before and after."""
    from minicomp.dispatch import dynamo

    names: list[str] = []
    compile_graph = dynamo.compile_graph

    def counting(gm, name="fn", *args, **kwargs):
        names.append(name)
        return compile_graph(gm, name, *args, **kwargs)

    monkeypatch.setattr(dynamo, "compile_graph", counting)
    torch._dynamo.reset()
    yield names
    torch._dynamo.reset()


@pytest.fixture
def own_regions():
    """This process's registry of chunked regions (chunked_rows.REGIONS) empty for the test, then as
    it was: a region an earlier test made (its joints compiled) is not this test's to reuse."""
    from minicomp.dispatch import chunked_rows

    earlier = dict(chunked_rows.REGIONS)
    chunked_rows.REGIONS.clear()
    yield chunked_rows.REGIONS
    chunked_rows.REGIONS.clear()
    chunked_rows.REGIONS.update(earlier)
