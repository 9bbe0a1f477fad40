"""Cache behaviour, debug dumps, the fallback policy (the installed wheel: tests/tools/test_package.py)."""

import warnings

import pytest
import torch
import workloads as w

import minicomp
from minicomp import runtime


def test_second_call_hits_the_cache(device):
    fn = minicomp.jit(w.bias_relu)
    x, b = torch.randn(5, 7, device=device), torch.randn(7, device=device)
    fn(x, b)
    fn(x + 1, b * 2)  # new values, same signature
    assert fn.compiles == 1
    fn(torch.randn(6, 7, device=device), b)  # new shape: a new signature
    assert fn.compiles == 2
    fn(x.to(torch.float16), b.to(torch.float16))
    assert fn.compiles == 3


def test_python_scalars_key_the_cache():
    fn = minicomp.jit(lambda x, s: x * s)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x, 2.0), x * 2.0)
    torch.testing.assert_close(fn(x, 3.0), x * 3.0)
    assert fn.compiles == 2


def test_modules_land_in_the_cache_dir_and_the_debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_DEBUG_DIR", str(tmp_path / "debug"))
    fn = minicomp.jit(w.swiglu)
    g, u = torch.randn(3, 9), torch.randn(3, 9)
    source = fn.source(g, u)
    assert runtime.module_path(source, "swiglu").read_text() == source
    dumped = list((tmp_path / "debug").glob("swiglu_*.py"))
    assert len(dumped) == 1 and dumped[0].read_text() == source


def test_untraceable_function_falls_back_to_eager_with_a_warning():
    def data_dependent(x):
        return x * 2 if x.sum() > 0 else x - 1

    x = torch.ones(3)
    with pytest.warns(UserWarning, match="branches on tensor values.*Running it eagerly"):
        out = minicomp.jit(data_dependent, fallback="warn")(x)
    torch.testing.assert_close(out, x * 2)
    with pytest.raises(
        minicomp.CompileError, match="could not compile data_dependent: it branches on tensor values.*torch.where"
    ):
        minicomp.jit(data_dependent, fallback="raise")(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        minicomp.jit(data_dependent, fallback="silent")(x)
