"""Issue: fast calls and compiles. Lean dispatch, the persistent cache, shapes, threads."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import workloads as w
from conftest import kernel_text

import minicomp
from minicomp import capture, codegen, runtime
from minicomp.__main__ import main as cli
from minicomp.guards import fingerprint
from minicomp.runtime import cache

ROOT = Path(__file__).resolve().parents[2]

# A script a fresh process runs: compile rope from the example, report what it did.
PROBE = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {examples!r})
    import minicomp, minicomp.capture
    from rope import rope
    traces = []
    real_trace = minicomp.capture.trace
    minicomp.capture.trace = lambda *a, **k: traces.append(1) or real_trace(*a, **k)
    q, k = torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16)
    cos, sin = torch.randn(8, 16), torch.randn(8, 16)
    start = time.perf_counter()
    out = minicomp.jit(rope, fallback="raise")(q, k, cos, sin)
    seconds = time.perf_counter() - start
    ok = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(out, rope(q, k, cos, sin)))
    print(ok, len(traces), f"{{seconds:.3f}}")
""").format(examples=str(ROOT / "examples"))


def run_probe(cache: Path, count: int = 1) -> list[list[str]]:
    """Start `count` fresh processes at once on one cache dir; each prints 'ok traces seconds'."""
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(out.split())
    return results


def test_second_process_reuses_the_module_without_tracing(tmp_path):
    [[ok, traces, _]] = run_probe(tmp_path)
    assert ok == "True" and traces == "1"
    [[ok, traces, _]] = run_probe(tmp_path)
    assert ok == "True" and traces == "0"  # found through the persistent index: no trace, no codegen


# A fresh process's first call, with what it imported: a cache hit must not load the compiler.
WARM = textwrap.dedent("""
    import sys, torch
    x, b = torch.randn(8, 16), torch.randn(16)
    import minicomp
    f = minicomp.jit(lambda x, b: torch.relu(x + 0.5 * x * b + b), fallback="raise")
    assert torch.allclose(f(x, b), torch.relu(x + 0.5 * x * b + b))
    heavy = ("torch._dynamo", "functorch", "minicomp.pipeline", "minicomp.plan.fusion", "minicomp.codegen.module")
    print(" ".join(m for m in heavy if m in sys.modules) or "none")
""")


def test_warm_call_in_a_fresh_process_imports_no_compiler(tmp_path):
    """Issue #17: `import minicomp` imported functorch.compile, hence all of torch._dynamo (about
    1.7 s of a 2 s import), although a cache hit needs none of it. The first process compiles
    (and loads what it needs); the second is served from the cache without it."""
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path))
    run = [subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in run), run[-1].stderr
    assert "minicomp.pipeline" in run[0].stdout  # the cold one compiled
    assert run[1].stdout.strip() == "none", run[1].stdout


def test_two_processes_compiling_at_once_agree(tmp_path):
    results = run_probe(tmp_path, count=2)
    assert all(ok == "True" for ok, _, _ in results)
    modules = list((tmp_path / "modules").glob("*.py"))
    assert len(modules) == 1 and len(list((tmp_path / "entries").glob("*.json"))) == 1
    assert not list(tmp_path.rglob("*.tmp"))  # every write was renamed into place


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A cache that one fresh process running PROBE filled (each damage test damages a copy)."""
    cache_dir = tmp_path_factory.mktemp("probed")
    [[ok, traces, _]] = run_probe(cache_dir)
    assert ok == "True" and traces == "1"
    return cache_dir


@pytest.mark.parametrize("damage", ["truncate_module", "garbage_entry", "missing_module"])
def test_damaged_cache_entries_are_rebuilt(tmp_path, damage, probed):
    shutil.copytree(probed, tmp_path, dirs_exist_ok=True, symlinks=True)
    module = next((tmp_path / "modules").glob("*.py"))
    entry = next((tmp_path / "entries").glob("*.json"))
    if damage == "truncate_module":
        module.write_text(module.read_text()[:200])
    elif damage == "garbage_entry":
        entry.write_text("{not json")
    else:
        module.unlink()
    [[ok, traces, _]] = run_probe(tmp_path)
    assert ok == "True" and traces == "1"  # compiled again...
    [[ok, traces, _]] = run_probe(tmp_path)
    assert ok == "True" and traces == "0"  # ...and the rebuilt entry serves the next process
    assert cache.read_record(next((tmp_path / "entries").glob("*.json")))["sha"] == runtime.source_hash(
        next((tmp_path / "modules").glob("*.py")).read_text()
    )


def test_a_cache_hit_call_does_not_trace_or_render(monkeypatch):
    fn = minicomp.jit(w.bias_relu)
    x, b = torch.randn(4, 8), torch.randn(8)
    fn(x, b)

    def forbidden(*args, **kwargs):
        raise AssertionError("a cache hit must not trace or render")

    monkeypatch.setattr(capture, "trace", forbidden)
    monkeypatch.setattr(codegen, "render_module", forbidden)
    torch.testing.assert_close(fn(x * 2, b), torch.relu(x * 2 + b))


@pytest.mark.parametrize(
    "workload, shapes",
    [
        (w.rope, [[(2, 3, 8, 16), (2, 3, 8, 16), (8, 16), (8, 16)], [(5, 3, 8, 16), (5, 3, 8, 16), (8, 16), (8, 16)]]),
        (w.bias_relu, [[(4, 96), (96,)], [(7, 96), (96,)]]),
        (w.swiglu, [[(3, 5, 64), (3, 5, 64)], [(3, 9, 64), (3, 9, 64)]]),  # sequence length too: it merges into rows
    ],
)
def test_batch_size_does_not_change_the_kernel_text(workload, shapes):
    fn = minicomp.jit(workload)
    texts = [kernel_text(fn.source(*[torch.randn(s) for s in signature])) for signature in shapes]
    assert texts[0] and texts[0] == texts[1]


def test_misaligned_views_share_the_module_and_stay_right(device):
    """Triton specializes on 16-byte alignment; the direct launch checks it and
    sends a misaligned view through Triton's JIT instead (launch.py)."""
    fn = minicomp.jit(lambda x: x * 2 + 1)
    base = torch.randn(4097, device=device)
    aligned, shifted = base[:4096], base[1:]
    for x in (aligned, shifted, aligned, shifted):
        torch.testing.assert_close(fn(x), x * 2 + 1)
    assert fn.compiles == 1


def test_same_kernel_text_for_other_dtypes_gets_its_own_binary(device):
    """`x * 2 + 1` renders the same Triton text for float32 and int32: the
    compiled binaries (and launch.py's records of them) must not be shared."""
    fn = minicomp.jit(lambda x: x * 2 + 1)
    for x in (
        torch.randn(300, device=device),
        torch.arange(300, device=device, dtype=torch.int32),
        torch.randn(300, device=device).half(),
    ):
        torch.testing.assert_close(fn(x), x * 2 + 1)


def test_threads_share_one_function():
    fn = minicomp.jit(w.lora_epilogue)
    errors = []

    def worker(seed):
        gen = torch.Generator().manual_seed(seed)
        for rows in (3, 5, 3, 5):
            x, y, b = (torch.randn(rows, 32, generator=gen) for _ in range(2)), None, None
            x, y = x
            b = torch.randn(32, generator=gen)
            try:
                torch.testing.assert_close(fn(x, y, b), w.lora_epilogue(x, y, b))
            except Exception as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fn.compiles == 2  # two shapes, each compiled once despite four threads racing


def test_many_shapes_are_bounded_and_warned_about(monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_LIMIT", "4")  # settings go through config.py, read at jit time
    monkeypatch.setenv("MINICOMP_RECOMPILE_WARNING", "3")
    fn = minicomp.jit(lambda x: torch.relu(x) * 3)
    with pytest.warns(UserWarning, match=r"compiled <lambda> for 3 signatures \(last change: argument 0: shape"):
        for n in range(1, 9):
            x = torch.randn(n)
            torch.testing.assert_close(fn(x), torch.relu(x) * 3)
    assert len(fn.cache) == 4 and fn.compiles == 8
    x = torch.randn(1)  # evicted long ago: compiled again, still right
    torch.testing.assert_close(fn(x), torch.relu(x) * 3)


SCALE = 2.0


def scaled(x):
    return x * SCALE


def test_fingerprint_follows_code_constants_and_helpers(monkeypatch):
    before = fingerprint.of(scaled)
    assert before == fingerprint.of(scaled)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    assert fingerprint.of(scaled) != before  # a global constant is part of it
    assert fingerprint.of(w.rope) != fingerprint.of(w.bias_relu)
    weight = torch.randn(3)
    assert fingerprint.of(lambda x: x * weight) is None  # a closed-over tensor: never persisted


def test_cache_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    minicomp.jit(w.swiglu)(torch.randn(4, 8), torch.randn(4, 8))
    assert cli(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert str(tmp_path) in info and "modules" in info and "entries" in info
    assert cli(["cache", "clear"]) == 0
    assert "removed 2 files" in capsys.readouterr().out
    assert not list(tmp_path.rglob("*.py"))


@pytest.mark.gpu  # launch tuning runs on the GPU only
def test_large_kernels_are_tuned_once_and_remembered(tmp_path, monkeypatch):
    from minicomp import config
    from minicomp.runtime import launch

    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    x = torch.randn(config.get("tune_min_numel"), device="cuda")
    fn = minicomp.jit(lambda x: torch.relu(x) + 1)
    torch.testing.assert_close(fn(x), torch.relu(x) + 1)
    [record] = (tmp_path / "tuning").glob("*.json")
    chosen = cache.read_record(record)["config"]  # checksummed records (runtime/cache.py)
    assert tuple(chosen) in config.get("launch_candidates")
    runtime.forget_loaded()
    again = minicomp.jit(lambda x: torch.relu(x) + 1)
    timed = []
    monkeypatch.setattr(launch.Launch, "_time", lambda self, config, args: timed.append(config) or 1.0)
    torch.testing.assert_close(again(x), torch.relu(x) + 1)
    assert timed == []  # the second module read the choice from disk


CUDA_PROBE = textwrap.dedent("""
    import torch, minicomp
    from minicomp.tools.workloads import bias_relu
    x, b = torch.randn(1000, 96, device="cuda"), torch.randn(96, device="cuda")
    assert torch.equal(minicomp.jit(bias_relu, fallback="raise")(x, b), torch.relu(x + b))
""")


@pytest.mark.gpu  # compiled kernels exist on the GPU only
def test_second_process_loads_the_compiled_kernel_without_triton_jit(tmp_path):
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        MINICOMP_LOGS="cache",
    )
    runs = [
        subprocess.run([sys.executable, "-c", CUDA_PROBE], env=env, capture_output=True, text=True) for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert "compiled kernel loaded from" not in runs[0].stderr
    assert "compiled kernel loaded from" in runs[1].stderr and "entry" in runs[1].stderr


def test_compile_breakdown_names_each_stage(device):
    """Issue #17: where a compile went (Compiled.breakdown, explain's "compile time" section,
    the bench's compile rows): capture, ir, plan, codegen, load; and on a GPU, after the first
    call, the kernels' Triton compiles (started ahead, in threads; or loads of binaries an earlier
    process compiled) and tuning, and how many binaries Triton compiled."""
    x, b = torch.randn(8, 16, device=device), torch.randn(16, device=device)
    fn = minicomp.jit(lambda x, b: torch.relu(x * 2 + b), fallback="raise")
    fn(x, b)
    compiled = fn.compiled(x, b)
    parts = compiled.breakdown()
    ahead = ["compile ahead"] if device.type == "cuda" else []
    stages = ["capture", "ir", "plan", "codegen", "load", *ahead, "triton compile", "tuning"]
    assert list(parts)[: len(stages)] == stages and all(parts[s] >= 0 for s in stages)
    kernels = parts["kernels compiled"] + parts["kernels loaded"]
    assert kernels == (len(compiled.kernels) if device.type == "cuda" else 0)  # the interpreter compiles nothing
    assert parts["triton compiles"] <= (len(compiled.kernels) if device.type == "cuda" else 0)
    assert "compile time" in str(minicomp.explain(fn, x, b))


COMBO = """
import triton
import triton.language as tl


@triton.jit
def part(x_ptr, n_elements, pid, BLOCK_SIZE: tl.constexpr):
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n_elements) {op}, mask=offsets < n_elements)


@triton.jit
def combo(x_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    part(x_ptr, n_elements, tl.program_id(0), BLOCK_SIZE)
"""


def test_a_kernel_is_named_on_disk_by_the_functions_it_calls_too():
    """A combined launch's text names its parts without holding them: two modules' combos of one
    text may call different parts, and must not share a launch or tuning record."""
    from minicomp.runtime import launch

    texts = []
    for op in ("* 2", "+ 1"):
        module = runtime.load(COMBO.format(op=op), f"combo_text_{len(texts)}", interpret=False)
        texts.append(launch.Launch(module.combo, runtime.PointwiseLaunch(numel=8), device="cpu").records.text())
    assert texts[0] != texts[1] and all("def part" in t for t in texts)


class _Tied(torch.nn.Module):
    """Shared and tied parameters, a None bias, an aliased and a None buffer, a shared submodule."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = self.a
        self.c = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False), torch.nn.BatchNorm1d(3))
        self.w = torch.nn.Parameter(torch.ones(3))
        self.tied = self.w
        self.register_buffer("k", torch.ones(3))
        self.register_buffer("k_alias", self.k)
        self.register_buffer("absent", None)

    def forward(self, x, scale=1.0):
        return self.c(self.b(self.a(x)) * self.w * self.k) * scale


def test_a_module_calls_state_is_named_and_flattened_as_pytree_does():
    """A jit module's call gathers its parameters and buffers in one walk (modules.named_state) and
    flattens `(state, *args)` without pytree (arguments.py); both give exactly what the general path gives."""
    from torch.utils import _pytree as pytree

    from minicomp.dispatch.modules import named_state

    module = _Tied()
    expected = dict(module.named_parameters())
    expected.update(module.named_buffers())
    state = named_state(module)
    assert list(state) == list(expected) and all(a is b for a, b in zip(state.values(), expected.values()))
    compiled = minicomp.jit(module).compiled
    for args in [(state, torch.randn(2, 3)), (state, torch.randn(2, 3), 2.0), (state, torch.randn(2, 3), None)]:
        leaves, spec = compiled.arguments.flatten(args, {})
        want_leaves, want_spec = pytree.tree_flatten(((args[0], *args[1:]), {}))
        assert spec == want_spec and len(leaves) == len(want_leaves)
        assert all(a is b for a, b in zip(leaves, want_leaves))


def test_a_module_whose_parameters_change_between_calls_stays_right():
    """A parameter replaced, a buffer added, a tie broken: each call matches eager."""
    module = _Tied().eval()
    jitted = minicomp.jit(module)
    x = torch.randn(4, 3)
    torch.testing.assert_close(jitted(x), module(x))
    module.a.weight = torch.nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(jitted(x), module(x))
    module.tied = torch.nn.Parameter(torch.full((3,), 2.0))  # now its own parameter, unused by forward
    torch.testing.assert_close(jitted(x, 3.0), module(x, 3.0))
    module.register_buffer("extra", torch.zeros(1))
    torch.testing.assert_close(jitted(x), module(x))


def test_a_shared_submodule_keeps_its_parameters_after_a_call():
    """A submodule registered under two names (`self.b = self.a`): the trace's functional_call left
    its parameters replaced by FunctionalTensors in the caller's module, and the next call of any
    function on it failed. Every table is now put back entry by entry."""
    module = _Tied().eval()
    before = {n: t for n, t in module.named_parameters(remove_duplicate=False)}
    before.update(module.named_buffers(remove_duplicate=False))
    minicomp.jit(module)(torch.randn(4, 3))
    after = dict(module.named_parameters(remove_duplicate=False))
    after.update(module.named_buffers(remove_duplicate=False))
    assert before.keys() == after.keys() and all(after[n] is t for n, t in before.items())
    x = torch.randn(4, 3)
    torch.testing.assert_close(minicomp.jit(module)(x), module(x))
