"""Compiling ahead (launch.py `prepare`, ahead.py): a module's kernels start compiling in threads
before the first call, one task per configuration the first call may choose.

On the CPU nothing compiles (the interpreter runs the source), so these tests drive a `Launch`
for "cuda" with a stand-in for the @triton.jit function: what is checked is the orchestration
(which configurations, in which threads, side by side, under whose settings, what a failure
does). The real compiles run in the GPU suite (every test of test_fast_calls.py with the cuda
device) and in benchmarks/experiments/cold_start.py.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections import defaultdict

import pytest
import torch

from minicomp import config
from minicomp.runtime import launch, launch_configs, records
from minicomp.runtime.launch_spec import PointwiseLaunch, ReductionLaunch


class StandInKernel:
    """What `prepare` uses of a @triton.jit function: its name, text, JIT caches and `warmup`."""

    __name__ = "mc_stand_in_0"
    src = "def mc_stand_in_0(x_ptr, n_elements, BLOCK_SIZE):\n    pass\n"

    def __init__(self, rendezvous: int = 1, fail: tuple = ()):
        self.device_caches = defaultdict(lambda: "made by prepare")
        self.warmups: list[tuple] = []
        self.barrier = threading.Barrier(rendezvous, timeout=10)  # all tasks must be running at once
        self.fail = fail

    def warmup(self, *signature, grid, num_warps, **blocks):
        config = (next(iter(blocks.values())), num_warps)
        self.warmups.append((signature, grid, blocks, num_warps, threading.current_thread().name))
        self.barrier.wait()
        if config in self.fail:
            raise RuntimeError("out of resources")
        return StandInBinary()


class StandInBinary:
    hash, metadata_group = "0" * 8, {}
    src = types.SimpleNamespace(signature={"x_ptr": "*fp32"}, constants={})

    def _init_handles(self):
        self.loaded_by = threading.current_thread().name


@pytest.fixture
def gpu_less(monkeypatch, tmp_path):
    """A Launch for "cuda" on a machine without one: no device switch, a fixed file key."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch.torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(
        records.Records, "key", lambda self, *parts, skeleton=False: "key" + "".join(filter(str.isalnum, repr(parts)))
    )


def finished(la: launch.Launch) -> None:
    for task in la.ahead.tasks:
        task.result(timeout=30)


def test_a_small_kernel_compiles_its_heuristic_config_in_a_pool_thread(gpu_less):
    kernel = StandInKernel()
    la = launch.Launch(kernel, PointwiseLaunch(numel=4096), device="cuda:0")
    la.prepare([torch.float32, 4096])
    finished(la)
    [(signature, grid, blocks, warps, thread)] = kernel.warmups
    assert signature == (torch.float32, 4096) and grid == (1,)
    assert (blocks["BLOCK_SIZE"], warps) == launch_configs.heuristic(4096, torch.device("cuda"))
    assert thread.startswith("minicomp-compile")
    assert kernel.device_caches[0] == "made by prepare"  # made before the threads share it
    [(binary, through_jit)] = la.ahead.binaries.values()
    assert through_jit and binary.loaded_by.startswith("minicomp-compile") and la.compiles == 1
    assert la.ahead.aligned == {0}  # the tensor argument, assumed 16-byte aligned


def test_reduction_kernels_compile_without_fp_contraction(gpu_less):
    """A reduction kernel recomputes values its reduction read (softmax: x * c for the max, then
    x * c - max): contracted into an FMA the two differ by the product's rounding, which exp turned
    into NaN on the H200 for products near 1e30. Its compiles and launches ask Triton not to
    contract; a pointwise kernel computes each value once and keeps Triton's default."""
    reduction, pointwise = StandInKernel(), StandInKernel()
    launches = [
        launch.Launch(reduction, ReductionLaunch(rows=64, rblock=128, extent=100), device="cuda:0"),
        launch.Launch(pointwise, PointwiseLaunch(numel=4096), device="cuda:0"),
    ]
    for la in launches:
        la.prepare([torch.float32, la.spec.numel])
        finished(la)
    [(*_, blocks, _, _)] = reduction.warmups
    assert blocks == {"XBLOCK": blocks["XBLOCK"], "enable_fp_fusion": False}
    [(*_, blocks, _, _)] = pointwise.warmups
    assert list(blocks) == ["BLOCK_SIZE"]


def test_a_tuned_kernel_compiles_every_candidate_side_by_side(gpu_less):
    candidates = ((512, 4), (1024, 8))
    kernel = StandInKernel(rendezvous=len(candidates))  # serial tasks would never meet: the barrier times out
    la = launch.Launch(kernel, PointwiseLaunch(numel=1 << 12), device="cuda:0")
    with config.override(tune_min_numel=1, launch_candidates=candidates):
        la.prepare([torch.bfloat16, torch.bfloat16, 1 << 12])
    finished(la)
    assert sorted(la.ahead.binaries) == sorted(candidates) and la.compiles == 2
    assert len({w[-1] for w in kernel.warmups}) == 2  # two threads


def test_the_first_call_chooses_among_what_prepare_found_under_the_compiles_settings(gpu_less, monkeypatch):
    """A backward's first call runs on autograd's thread, without the compile's `config.override`:
    the configurations were fixed by `prepare`, in the compiling thread. A kernel of the same
    skeleton prepared at the same time takes the first one's measured choice instead of timing."""
    candidates = ((512, 4), (1024, 8))
    la, twin = (
        launch.Launch(StandInKernel(rendezvous=2), PointwiseLaunch(numel=1 << 12), device="cuda:0") for _ in range(2)
    )
    with config.override(tune_min_numel=1, launch_candidates=candidates):
        la.prepare([torch.float32, 1 << 12])
        twin.prepare([torch.float32, 1 << 12])
    finished(la), finished(twin)
    timed = []
    monkeypatch.setattr(launch.Launch, "_time", lambda self, c, args: timed.append(c) or c[0])
    assert la.choose([]) == (512, 4) and timed == list(candidates)  # outside the override: still tuned
    assert la.records.remembered_config(la.spec.numel) == (512, 4)  # and remembered for the next process
    assert twin.ahead.configs == list(candidates)  # prepared before the record existed
    assert twin.choose([]) == (512, 4) and timed == list(candidates)  # the record, not timed again


def test_a_failed_compile_ahead_is_left_to_the_first_call(gpu_less, caplog):
    candidates = ((512, 4), (1024, 8))
    la = launch.Launch(StandInKernel(rendezvous=2, fail=((1024, 8),)), PointwiseLaunch(numel=1 << 12), device="cuda:0")
    with (
        config.override(tune_min_numel=1, launch_candidates=candidates),
        caplog.at_level("INFO", "minicomp.cache"),
    ):
        la.prepare([torch.float32, 1 << 12])
        finished(la)  # no exception escapes a task
    assert list(la.ahead.binaries) == [(512, 4)]
    assert "compile ahead of (1024, 8) failed (RuntimeError: out of resources)" in caplog.text


def test_tuning_records_are_shared_by_kernels_of_one_skeleton(monkeypatch, tmp_path):
    """Two kernels that differ only in name (and the same size) share one tuning record."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch.torch.cuda, "get_device_name", lambda device=None: "a GPU")
    first, second = StandInKernel(), StandInKernel()
    second.__name__ = "mc_other_name_7"
    second.src = first.src.replace(first.__name__, second.__name__)
    a, b = (launch.Launch(k, PointwiseLaunch(numel=1 << 12), device="cuda:0") for k in (first, second))
    assert a.records.tuning_path(1 << 12) == b.records.tuning_path(1 << 12)
    assert a.records.key() != b.records.key()  # their binaries' records stay apart
    assert a.records.tuning_path(1 << 13) != a.records.tuning_path(1 << 12)


def test_nothing_is_prepared_for_the_interpreter():
    kernel = StandInKernel()
    la = launch.Launch(kernel, PointwiseLaunch(numel=64), device="cpu")
    la.prepare([torch.float32, 64])
    assert la.ahead.tasks == [] and kernel.warmups == []


def test_dynamo_compiles_the_backward_with_the_forward(monkeypatch):
    """Through torch.compile(backend=minicomp) the backward graph is compiled when the forward is
    (not at the first backward), so its kernels compile ahead while the forward runs."""
    import torch._functorch.config as functorch_config

    import minicomp.dispatch.dynamo
    import minicomp.pipeline

    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        pytest.skip("this torch compiles the backward lazily only")
    torch._dynamo.reset()
    roles = []

    def spy(gm, name, **kwargs):
        roles.append(name.rsplit("_", 1)[-1])
        return minicomp.pipeline.compile_graph(gm, name, **kwargs)

    monkeypatch.setattr(minicomp.dispatch.dynamo, "compile_graph", spy)
    x = torch.randn(4, 8, requires_grad=True)
    fn = torch.compile(lambda x: torch.relu(x * 2).sum(-1), backend=minicomp.dispatch.dynamo.backend)
    out = fn(x)
    assert roles == ["forward", "backward"]  # no backward has run yet
    out.sum().backward()
    torch.testing.assert_close(x.grad, (x > 0).float() * 2)
    assert roles == ["forward", "backward"]  # and it did not compile again


def test_a_kernel_that_cannot_be_prepared_is_compiled_by_its_first_call(gpu_less):
    """Whatever `prepare` meets in the compiling thread (here a Triton without the JIT cache it
    expects) leaves the kernel as if never prepared, and never fails the compile."""
    kernel = StandInKernel()
    del kernel.device_caches
    la = launch.Launch(kernel, PointwiseLaunch(numel=64), device="cuda:0")
    la.prepare([torch.float32, 64])
    assert la.ahead.tasks == [] and la.ahead.configs == [] and kernel.warmups == []


def test_triton_starts_once_per_device_for_the_first_cuda_argument(monkeypatch):
    """A miss on a GPU starts Triton's one-time costs in a pool thread (compile_pool.start_triton);
    CPU arguments start nothing, and a second miss on the same device does not start it again."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from minicomp.runtime import compile_pool

    started = []
    monkeypatch.setattr(compile_pool, "_TRITON_STARTED", {})
    monkeypatch.setattr(compile_pool, "_start_triton", lambda index: started.append(index))
    compile_pool.start_triton([torch.randn(2), 3, "text"])
    assert compile_pool._TRITON_STARTED == {}
    with FakeTensorMode():  # a CUDA tensor even without a GPU, as Dynamo's example inputs are
        on_gpu = torch.empty(2, device="cuda:0")  # (cuda:1 does not exist on a one-GPU machine)
    compile_pool.start_triton([torch.randn(2), on_gpu])
    compile_pool.start_triton([on_gpu])
    compile_pool.triton_started(0)
    assert started == [0] and list(compile_pool._TRITON_STARTED) == [0]


def test_a_new_size_of_a_tuned_size_class_takes_its_choice_untimed(gpu_less, monkeypatch):
    """Issue #42: a new length or batch size whose size class (the next power of two) was tuned
    takes the remembered configuration; a size of another class is timed."""
    candidates = ((512, 4), (1024, 8))
    timed = []
    monkeypatch.setattr(launch.Launch, "_time", lambda self, c, args: timed.append(c) or c[0])
    with config.override(tune_min_numel=1, launch_candidates=candidates):
        first, same_class, other_class = (
            launch.Launch(StandInKernel(), PointwiseLaunch(numel=n), device="cuda:0") for n in (4088, 4000, 4100)
        )
        assert first.choose([]) == (512, 4) and timed == list(candidates)
        assert same_class.configs() == [(512, 4)]  # compiled ahead: the remembered one alone
        assert same_class.choose([]) == (512, 4) and len(timed) == 2  # not timed again
        assert other_class.choose([]) == (512, 4) and len(timed) == 4  # 4100 -> 8192: timed


def test_a_remembered_choice_that_is_no_candidate_of_this_size_is_timed_again(gpu_less, monkeypatch):
    """A class-mate's choice this size cannot take (a reduction's XBLOCK over its rows) is not taken."""
    timed = []
    monkeypatch.setattr(launch.Launch, "_time", lambda self, c, args: timed.append(c) or -c[0])
    la = launch.Launch(StandInKernel(), PointwiseLaunch(numel=3000), device="cuda:0")
    with config.override(tune_min_numel=1, launch_candidates=((512, 4), (1024, 8))):
        assert la.choose([]) == (1024, 8)
    with config.override(tune_min_numel=1, launch_candidates=((256, 4), (512, 4))):
        again = launch.Launch(StandInKernel(), PointwiseLaunch(numel=4000), device="cuda:0")
        assert again.configs() == [(256, 4), (512, 4)]
        assert again.choose([]) == (512, 4) and timed[-2:] == [(256, 4), (512, 4)]


def test_a_binary_loaded_once_serves_a_later_module_without_its_record(gpu_less, monkeypatch):
    """A new sequence length's module launches the kernel texts of the last one (a kernel family,
    codegen/families.py): its first calls bind the binaries this process already loaded, without
    reading their records or loading them onto the GPU again (issue #42: 30-40 ms of a Llama's
    0.25-0.33 s at a new length). A call whose pointers are not all aligned as the binary assumed
    is not served it."""
    first = launch.Launch(StandInKernel(), PointwiseLaunch(numel=1 << 10), device="cuda:0")
    path = first.records.binary_path((1024, 4), ["torch.float32", "int any i32"])
    binary = StandInBinary()
    first.records.remember(binary, path, {0})
    again = launch.Launch(StandInKernel(), PointwiseLaunch(numel=1 << 10), device="cuda:0")
    try:
        monkeypatch.setattr(records.cache, "read_record", lambda p: pytest.fail(f"read {p}"))
        assert again.records.restore(path, {0, 1}) is binary
        monkeypatch.setattr(records.cache, "read_record", lambda p: None)  # (no record on disk)
        assert again.records.restore(path, set()) is None  # pointer 0 not aligned here
        records.forget_restored()
        assert again.records.restore(path, {0}) is None
    finally:
        records.forget_restored()
