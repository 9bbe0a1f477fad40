"""Shared fixtures: the device under test, a private cache dir, eager comparison."""

from __future__ import annotations

import os
import re

import pytest
import torch

os.environ["MINICOMP_FALLBACK"] = "raise"  # a compile failure is a test failure, never a silent eager run

import minicomp  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    os.environ["MINICOMP_CACHE_DIR"] = str(tmp_path_factory.mktemp("minicomp-cache"))
    yield


@pytest.fixture(params=DEVICES)
def device(request):
    """Every test that takes `device` runs on CPU (Triton's interpreter) and on CUDA when present."""
    return torch.device(request.param)


def kernel_count(source: str) -> int:
    """Kernels a module launches (its @triton.jit combine helpers are not kernels)."""
    return len(re.findall(r"^launch_\d+ = Launch\(", source, flags=re.M))


def kernel_text(source: str) -> list[str]:
    """The Triton kernels of a module (what Triton compiles and keys its cache on)."""
    return re.findall(r"^@triton\.jit\ndef mc_.*?(?=^launch_)", source, flags=re.M | re.S)


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
