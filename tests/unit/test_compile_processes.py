"""Compile worker processes (runtime/compile_processes.py, runtime/compile_worker.py).

These run Triton's real compiler for sm_90 on the CPU machine: a worker compiles a kernel of a
generated module into Triton's cache, and this process's JIT, asked for the same kernel and
arguments, must find it there (a cache hit, so the keys agree). No GPU is touched: the active
driver here, as in the worker, is the stand-in that names the target.
"""

from __future__ import annotations

import io
import sys

import pytest
import torch

from minicomp import config
from minicomp.runtime import compile_processes, compile_worker, loader

pytest.importorskip("triton.backends.nvidia.compiler")

MODULE = '''"""minicomp: a generated module's shape: its Triton functions among torch and minicomp lines."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minicomp.runtime import Launch, PointwiseLaunch

SCALE = tl.constexpr(3.0)  # a module constant: not one of the worker's statements


@triton.jit
def _double(a):
    return a + a


@triton.jit
def mc_fused_double_exp_0(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, _double(libdevice.exp(x)), mask=mask)


@triton.jit
def mc_fused_scale_1(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * SCALE, mask=mask)


launch_0 = Launch(mc_fused_double_exp_0, PointwiseLaunch(numel=64), device="cuda:0")
'''
SIGNATURE = [torch.float32, torch.float32, 1000]


@pytest.fixture
def compiling(monkeypatch, tmp_path):
    """sm_90 as this process's target (the stand-in driver), Triton's cache in `tmp_path`, fresh
    workers; yields (the loaded module, the target, the JIT's cache hits and misses)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    target = GPUTarget("cuda", 90, 32)
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    monkeypatch.setenv("MINICOMP_COMPILE_PROCESSES", "2")
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "triton"))
    hits: list[bool] = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    monkeypatch.setattr(compile_processes, "_WORKERS", None)
    loader.forget_loaded()  # fresh JIT caches: each test's module is imported anew
    monkeypatch.setattr(driver, "_active", compile_worker.CompilingDriver(target))
    try:
        yield loader.load(MODULE, "workers", interpret=False), target, hits
    finally:
        if compile_processes._WORKERS is not None:
            compile_processes._WORKERS.close()


def test_a_worker_compiles_the_binary_the_jit_then_finds_in_its_cache(compiling):
    module, target, hits = compiling
    assert compile_processes.workers().wait_ready(30)
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    assert compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert hits == []  # nothing compiled or loaded here yet
    compiled = module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), **settings)
    assert hits == [True], "the worker's cache key differs from this process's"
    assert "cubin" in compiled.asm and compiled.metadata.num_warps == 4


def test_workers_compile_side_by_side_and_are_reused(compiling):
    import concurrent.futures

    module, target, hits = compiling
    assert compile_processes.workers().wait_ready(30)
    blocks = [64, 128, 256, 512]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # as many threads as workers
        done = list(
            pool.map(
                lambda b: compile_processes.compile_in_worker(
                    module.mc_fused_double_exp_0, SIGNATURE, {"BLOCK_SIZE": b, "num_warps": 4}, target
                ),
                blocks,
            )
        )
    assert done == [True] * 4
    assert len(compile_processes._WORKERS.all) == 2  # MINICOMP_COMPILE_PROCESSES
    for b in blocks:
        module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), BLOCK_SIZE=b, num_warps=4)
    assert hits == [True] * 4


def test_a_kernel_the_worker_cannot_build_is_compiled_here(compiling, caplog):
    """The worker keeps a module's Triton imports and functions only: a kernel reading another
    module-level name fails there and is compiled by the caller's own `warmup`, as before."""
    module, target, hits = compiling
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    assert compile_processes.workers().wait_ready(30)
    with caplog.at_level("INFO", logger="minicomp.cache"):
        assert not compile_processes.compile_in_worker(module.mc_fused_scale_1, SIGNATURE, settings, target)
    assert "compile worker could not" in caplog.text and "SCALE" in caplog.text
    module.mc_fused_scale_1.warmup(*SIGNATURE, grid=(1,), **settings)
    assert hits == [False]


def test_workers_that_die_at_their_start_cost_only_the_time(compiling, monkeypatch):
    module, target, hits = compiling
    monkeypatch.setattr(compile_processes, "_COMMAND", [sys.executable, "-c", "pass"])
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    assert not compile_processes.workers().wait_ready(30)  # both die at their start
    for _ in range(3):  # replaced `limit` times at most, then none is started again
        assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    pool = compile_processes._WORKERS
    assert pool.lost == 2 and pool.all == [] and pool.idle == []
    module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), **settings)
    assert hits == [False]


def test_workers_start_once_enough_compiles_are_outstanding(compiling):
    """A function's kernel or two compile in their threads at once; from config
    "compile_processes_from" outstanding compiles on, the next request starts the workers."""
    module, target, hits = compiling
    pool = compile_processes.workers()
    settings = {"BLOCK_SIZE": 64, "num_warps": 2}
    pool.expect(3)
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert pool.all == []  # none started for three compiles
    for _ in range(3):
        pool.finished()
    pool.expect(5)
    assert not pool.wanted  # (those three are done: five outstanding)
    pool.expect(3)
    assert pool.wanted
    compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert len(pool.all) == 2  # started by that request (which may have found none ready yet)
    assert pool.wait_ready(30)
    more = {"BLOCK_SIZE": 128, "num_warps": 2}
    assert compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, more, target)


def test_a_kernel_this_process_compiled_is_not_handed_over(compiling):
    module, target, hits = compiling
    assert compile_processes.workers().wait_ready(30)
    settings = {"BLOCK_SIZE": 32, "num_warps": 1}
    module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), **settings)
    assert compile_processes.serialized(module.mc_fused_double_exp_0, SIGNATURE, settings) is None
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert hits == [False]


def test_no_triton_setting_changes_and_a_stages_hook_keeps_compiles_here(compiling, monkeypatch):
    """The specialization is made without a `jit_cache_hook` (one set makes Triton serialize every
    compile's arguments, which fails for a JIT function passed as a constant); a stages inspection
    hook runs only in this process, so with one set nothing is handed over."""
    from triton import knobs

    module, target, hits = compiling
    assert compile_processes.workers().wait_ready(30)
    settings = {"BLOCK_SIZE": 128, "num_warps": 2}
    assert compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert knobs.runtime.jit_cache_hook is None
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda *a, **k: None)
    more = {"BLOCK_SIZE": 256, "num_warps": 2}
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, more, target)


def test_a_worker_of_another_triton_refuses(compiling):
    module, target, _ = compiling
    pool = compile_processes.workers()
    assert pool.wait_ready(30)
    fingerprint, key = compile_processes._this_triton()
    request = {
        "path": module.mc_fused_double_exp_0.fn.__code__.co_filename,
        "module": module.mc_fused_double_exp_0.fn.__module__,
        "kernel": "mc_fused_double_exp_0",
        "specialization": compile_processes.serialized(module.mc_fused_double_exp_0, SIGNATURE, {"BLOCK_SIZE": 64}),
        "target": (target.backend, target.arch, target.warp_size),
        "cache_dir": "unused",
        "triton": ((*fingerprint[:-1], fingerprint[-1] + 1), key),  # its library rebuilt in place
    }
    reply = pool.ask(request)
    assert not reply["ok"] and "not the main process's" in reply["error"]


# says it is ready, then exits at its first request without a reply
_DIES_ON_REQUEST = (
    "import pickle, struct, sys\n"
    "data = pickle.dumps({'ready': True})\n"
    "sys.stdout.buffer.write(struct.pack('<Q', len(data)) + data); sys.stdout.flush()\n"
    "sys.stdin.buffer.read(8)\n"
)


def test_a_worker_that_dies_on_a_request_is_lost_and_the_thread_compiles(compiling, monkeypatch):
    module, target, hits = compiling
    monkeypatch.setattr(compile_processes, "_COMMAND", [sys.executable, "-c", _DIES_ON_REQUEST])
    pool = compile_processes.workers()
    assert pool.wait_ready(30)
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert pool.lost == 1 and len(pool.all) == 1
    module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), **settings)
    assert hits == [False]


def test_a_worker_never_ready_is_given_up_after_its_start_limit(compiling, monkeypatch):
    import time

    module, target, _ = compiling
    monkeypatch.setattr(compile_processes, "_COMMAND", [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(compile_processes, "START_LIMIT", 0.3)
    pool = compile_processes.workers()
    pool.prestart()
    time.sleep(0.5)
    start = time.monotonic()
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, {"BLOCK_SIZE": 64}, target)
    assert pool.lost == 2 and pool.all == []  # none replaced past the limit: no request waits again
    assert time.monotonic() - start < 1.5


def test_a_compile_waits_a_bounded_time_for_a_starting_worker_then_runs_here(compiling, monkeypatch):
    """Workers that do not get ready (here: never) are waited for READY_WAIT seconds at most."""
    import time

    module, target, hits = compiling
    monkeypatch.setattr(compile_processes, "_COMMAND", [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(compile_processes.Workers, "READY_WAIT", 0.2)
    compile_processes.workers().expect(8)
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    start = time.monotonic()
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)
    assert time.monotonic() - start < 1.5
    assert len(compile_processes._WORKERS.all) == 2
    module.mc_fused_double_exp_0.warmup(*SIGNATURE, grid=(1,), **settings)
    assert hits == [False]


def test_no_workers_at_zero_or_without_a_target_or_a_jit_function(compiling, monkeypatch):
    module, target, _ = compiling
    settings = {"BLOCK_SIZE": 128, "num_warps": 4}
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, None)
    assert not compile_processes.compile_in_worker(object(), SIGNATURE, settings, target)
    monkeypatch.setenv("MINICOMP_COMPILE_PROCESSES", "0")
    monkeypatch.setattr(compile_processes, "_WORKERS", None)
    assert compile_processes.workers() is None
    assert not compile_processes.compile_in_worker(module.mc_fused_double_exp_0, SIGNATURE, settings, target)


def test_the_worker_keeps_triton_imports_and_jit_functions_at_their_lines(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MODULE)
    namespace = compile_worker.kernels_of(str(path), "minicomp_generated.m")
    assert {"triton", "tl", "libdevice", "_double", "mc_fused_double_exp_0", "mc_fused_scale_1"} <= set(namespace)
    assert not {"torch", "Launch", "SCALE", "launch_0"} & set(namespace)
    kernel = namespace["mc_fused_double_exp_0"]
    assert kernel.fn.__module__ == "minicomp_generated.m"
    lines = MODULE.splitlines()
    decorator = next(i for i, line in enumerate(lines) if line.startswith("def mc_fused_double_exp_0")) - 1
    assert lines[decorator] == "@triton.jit" and kernel.fn.__code__.co_firstlineno == decorator + 1


def test_frames_round_trip_and_a_cut_frame_ends_the_stream():
    stream = io.BytesIO()
    compile_worker.write_frame(stream, {"ok": True, "n": 3})
    compile_worker.write_frame(stream, {"ok": False})
    data = stream.getvalue()
    whole = io.BytesIO(data)
    assert compile_worker.read_frame(whole) == {"ok": True, "n": 3}
    assert compile_worker.read_frame(whole) == {"ok": False}
    assert compile_worker.read_frame(whole) is None
    assert compile_worker.read_frame(io.BytesIO(data[:-3])) == {"ok": True, "n": 3}
    cut = io.BytesIO(data[:-3])
    compile_worker.read_frame(cut)
    assert compile_worker.read_frame(cut) is None


def test_the_processes_setting_is_validated(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_THREADS", "6")
    monkeypatch.delenv("MINICOMP_COMPILE_PROCESSES", raising=False)
    assert config.compile_processes() == 6
    monkeypatch.setenv("MINICOMP_COMPILE_PROCESSES", "0")
    assert config.compile_processes() == 0
    monkeypatch.setenv("MINICOMP_COMPILE_PROCESSES", "-1")
    with pytest.raises(config.ConfigError, match="MINICOMP_COMPILE_PROCESSES must be a whole number >= 0"):
        config.compile_processes()


def test_closing_ends_every_worker_at_once_and_a_forked_child_leaves_them(compiling, monkeypatch):
    """At exit (atexit) every worker's input is closed first, then each is waited for: not a
    second each in turn."""
    import os
    import time

    pool = compile_processes.workers()
    assert pool.wait_ready(30)
    processes = [w.process for w in pool.all]
    with monkeypatch.context() as child:
        child.setattr(os, "getpid", lambda: pool.pid + 1)  # as in a forked child
        pool.close()
    assert all(p.poll() is None for p in processes) and len(pool.all) == 2
    start = time.monotonic()
    pool.close()
    assert all(p.poll() is not None for p in processes) and pool.all == []
    assert time.monotonic() - start < 5


def test_a_file_in_the_working_directory_does_not_shadow_the_workers_imports(compiling, tmp_path, monkeypatch):
    (tmp_path / "runpy.py").write_text("raise SystemExit('a local runpy.py ran')\n")
    (tmp_path / "pickle.py").write_text("raise SystemExit('a local pickle.py ran')\n")
    monkeypatch.chdir(tmp_path)
    assert compile_processes.workers().wait_ready(30)
