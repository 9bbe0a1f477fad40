"""Launching one generated kernel: pick its configuration once, then launch with nothing in between.

A generated module makes one `Launch` per kernel when it is imported,

    launch_0 = Launch(mc_fused_add_relu_0, numel=4096, device="cuda:0")

and its `call()` runs `launch_0(x, b, relu, 4096)`. The first call on a GPU
chooses (BLOCK_SIZE, num_warps) (`choose` below) and gets the compiled kernel:
from a record an earlier process left (`<cache>/kernels/`, pointing into
Triton's cache: no Triton JIT at all, which matters because Triton's first JIT
use in a process hashes its own installation, ~0.3 s), else through Triton's
JIT. Every later call hands the arguments straight to that kernel's C
launcher: no argument binding, no specialization key, no cache lookup. That is
safe because a module serves exactly one input signature (shapes, strides,
dtypes: the caller's guard in function.py checked them); the one property Triton
also specializes on that the guard does not cover, 16-byte alignment of each
pointer, is checked per call (a misaligned view goes through Triton's JIT).

The configurations a kernel is launched with, and the candidates it is tuned over:
launch_configs.py.

Compiling ahead (`prepare`): a module compiled in this process starts its kernels'
Triton compiles before their first call, in threads (compile_pool.py), one task
per configuration the first call may choose: the decoder block's cold first
training step (80 compiles) went from 33 s to 8-9 s on an H200 machine's 16 cores
(benchmarks/experiments/cold_start.py). Tuning records are named by the kernel's
text without its name (`skeleton`): kernels of one skeleton and size share a choice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import re
import statistics
import threading
import time
import types

import torch

from minicomp import config, logs
from minicomp.runtime import cache, compile_pool
from minicomp.runtime.launch_configs import heuristic, reduction_candidates, reduction_heuristic, valid_config

# Triton's interpreter patches triton.language module-wide while a kernel runs: two threads
# interpreting at once undo each other's patches ("Did you forget to add @triton.jit ?").
_INTERPRETER_LOCK = threading.Lock()
TIMED_RUNS = 15  # runs a tuning candidate is timed over (kernels this large run >= ~20 us each)
QUEUE_CYCLES = 4_000_000  # GPU clock cycles of sleep the timed launches queue behind (~2 ms)


class Launch:
    """One kernel of a generated module, launched as cheaply as Triton allows."""

    def __init__(
        self,
        kernel,
        numel: int,
        device: str,
        parts: int = 1,
        row: int = 0,
        extent: int = 0,
        groups: int = 0,
        pieces: tuple[int, ...] = (),
        planes: int = 0,
        group: int = 0,
    ):
        self.kernel, self.numel, self.device = kernel, numel, torch.device(device)
        self.pieces = pieces  # a combined launch (templates/combo.py.j2): each kernel's elements
        self.parts = parts  # elements written per offset
        self.row = row  # a reduction kernel's RBLOCK (numel then counts rows), else 0
        self.extent = extent  # a reduction kernel's row length (its work is numel * extent)
        self.groups = groups  # a grouped reduction kernel's programs: each takes its rows XBLOCK at a time
        self.planes, self.group = planes, group  # planes walked `group` side by side (codegen/plane_order.py)
        self.block_name = "XBLOCK" if row else "BLOCK_SIZE"
        # A reduction kernel computes a value in one pass and again in the next (softmax: x * c for
        # the row's max, then x * c - max inside exp). Contracted into an FMA the second pass skips
        # the product's rounding, so x * c - max(x * c) is the rounding error, not 0 (about 1e23 when
        # the products are ~1e30: exp overflowed, NaN where eager gives 1). Every op rounds, as in eager.
        self.options = {"enable_fp_fusion": False} if row else {}
        self.name = kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__
        self.config: tuple[int, int] | None = None
        self._fast = None  # the bound launcher, once the kernel is compiled
        self.times: dict[str, float] = {}  # the first call's tuning and compile (or load) seconds
        self.jit_compiled: bool | None = None  # its binary came through Triton's JIT (else from a record)
        self._first_call_compiled = False  # the first call compiled its binary itself (none ahead)
        self._lock = threading.Lock()
        self._ahead: dict[tuple[int, int], tuple] = {}  # config -> (compiled kernel, through the JIT)
        self._ahead_tasks: list[concurrent.futures.Future] = []
        self._ahead_aligned: set[int] = set()  # the pointers the ahead binaries assume 16-byte aligned
        self._ahead_kinds: list[str] = []  # and the argument kinds (`_kinds`) they were compiled for
        self._configs: list[tuple[int, int]] = []  # what `prepare` found the first call may choose

    def grid(self, block: int) -> int:
        if self.pieces:  # each piece's programs, one after the other
            return sum(-(-n // block) for n in self.pieces)
        if self.planes:  # every group of planes padded to `group` planes, each plane's blocks
            return -(-self.planes // self.group) * self.group * -(-(self.numel // self.planes) // block)
        return self.groups or -(-self.numel // block)

    @property
    def compiles(self) -> int:
        """Binaries Triton's JIT compiled for this kernel: ahead (every configuration tried) and on
        its first call (when none was compiled ahead)."""
        return sum(1 for _, through_jit in list(self._ahead.values()) if through_jit) + self._first_call_compiled

    @property
    def rows(self) -> int:
        """The rows a program's XBLOCK is chosen for: all of them, or a grouped kernel's group."""
        return -(-self.numel // self.groups) if self.groups else self.numel

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
            return fast(*args)
        if self.device.type == "cpu":  # the interpreter: nothing to keep (and no need to scale by parts)
            block, warps = self.heuristic()
            with _INTERPRETER_LOCK:
                self.kernel[(self.grid(block),)](*args, **self._settings(block, warps))
            return None
        return self._first_call(args)

    def _jit_launch(self, args):
        """Through Triton's JIT: it specializes on the arguments and caches the binaries."""
        block, warps = self.config
        return self.kernel[(self.grid(block),)](*args, **self._settings(block, warps))

    def _settings(self, block: int, warps: int) -> dict:
        """The keyword arguments of a launch (and of a compile) at (block, warps)."""
        return {self.block_name: block, "num_warps": warps, **self.options}

    def _first_call(self, args):
        with self._lock, torch.cuda.device(self.device):
            start = time.perf_counter()
            concurrent.futures.wait(self._ahead_tasks)  # this kernel's compiles ahead (prepare)
            waited = time.perf_counter()
            if self.config is None:
                self.config = self.choose(args)
            tuned = time.perf_counter()
            aligned = _aligned_positions(args)
            kinds = _kinds(args)
            same = aligned == self._ahead_aligned and kinds == self._ahead_kinds  # what the ahead binaries assumed
            ahead = self._ahead.get(self.config) if same else None
            compiled, through_jit = ahead or (self._restore(self._record_path(self.config, kinds), aligned), False)
            ran = compiled is None
            if ran:  # Triton's JIT compiles (or loads its disk cache) and runs this call
                compiled, through_jit = self._jit_launch(args), True
                self._first_call_compiled = True
                self._remember(compiled, self._record_path(self.config, kinds), aligned)
            self.times = {"tune": tuned - waited, "compile": (waited - start) + (time.perf_counter() - tuned)}
            self.jit_compiled = through_jit
            logs.cache.info(
                "%s: first call at %s x %s warps: %d Triton compiles, waited %.3f s for them, tuned %.3f s",
                self.name,
                *self.config,
                self.compiles,
                self.times["compile"],
                self.times["tune"],
            )
            fast = _bind(
                compiled, self.grid(self.config[0]), self.config[0], self.device.index or 0, aligned, self._jit_launch
            )
            if self._fast is None:
                self._fast = fast
        if not ran:
            fast(*args)
        return None

    # -- the compiled kernel across processes ------------------------------------
    # Triton's JIT hashes its own installation the first time a process uses it
    # (~0.3 s) and imports more of itself (~0.1 s). A second process that already
    # has the binary in Triton's cache skips all that: the path of each file of
    # the compiled kernel is remembered, and loaded straight into a CompiledKernel.
    def _record_path(self, config: tuple[int, int], kinds: list[str]):
        """One record per binary: kernel text, launch config, and what Triton specializes
        on besides alignment (`kinds`, see `_kinds`): each tensor's dtype, and of each
        integer (n_elements and the runtime sizes of codegen/families.py) whether it is 1,
        a multiple of 16, and 32 or 64 bits. Sizes themselves are not part of it, so a new
        batch size or sequence length reuses the binary."""
        block, warps = config
        return cache.file("kernels", f"{self.name}_{self._key(f'{block}x{warps}', kinds)}.json")

    def _remember(self, compiled, path, aligned) -> None:
        try:
            record = dict(
                hash=compiled.hash,
                metadata_group=compiled.metadata_group,
                aligned=sorted(aligned),
                signature=dict(compiled.src.signature),
                constants=[[list(k), v] for k, v in compiled.src.constants.items()],
            )
            cache.write_atomic(path, json.dumps(record))
        except (AttributeError, TypeError, ValueError, OSError) as err:  # not restorable: the JIT path stays
            logs.cache.info("%s: compiled kernel not remembered (%s)", self.name, err)

    def _restore(self, path, aligned):
        """The compiled kernel of an earlier process, or None (then Triton's JIT compiles or loads it)."""
        try:
            text = cache.read_text(path)
            if text is None:
                return None
            record = json.loads(text)
            if not set(record["aligned"]) <= aligned:  # compiled for 16-byte aligned pointers these are not
                return None
            from triton.compiler.compiler import CompiledKernel

            _inside_triton_cache(record["metadata_group"])
            src = types.SimpleNamespace(
                fn=self.kernel, signature=record["signature"], constants={tuple(k): v for k, v in record["constants"]}
            )
            compiled = CompiledKernel(src, record["metadata_group"], record["hash"])
            compiled._init_handles()
        except Exception as err:  # noqa: BLE001 - a stale or damaged record: compile through the JIT
            logs.cache.info("%s: remembered kernel not usable (%s: %s)", self.name, type(err).__name__, err)
            return None
        logs.cache.info("%s: compiled kernel loaded from %s", self.name, path)
        return compiled

    # -- configuration --------------------------------------------------------
    def heuristic(self) -> tuple[int, int]:
        if self.row:
            return reduction_heuristic(self.rows, self.row, self.device)
        if self.device.type == "cpu":
            return heuristic(self.numel, self.device)
        block, warps = heuristic(self.numel * self.parts, self.device)
        return self._per_part(block), warps

    def candidates(self) -> list[tuple[int, int]]:
        if self.row:
            return reduction_candidates(self.rows, self.row)
        return [(self._per_part(block), warps) for block, warps in config.get("launch_candidates")]

    def tuned(self) -> bool:
        """Whether the first call chooses the configuration by timing candidates (large kernels)."""
        return self.numel * max(self.parts, self.row, self.extent) >= config.get("tune_min_numel")

    def _tuning_path(self):
        """The tuning record: named by the kernel's skeleton (its text without its name) and size,
        so kernels that differ only in name share one measurement."""
        return cache.file("tuning", f"{self._key(self.numel, skeleton=True)}.json")

    def _remembered_config(self) -> tuple[int, int] | None:
        path = self._tuning_path()
        try:
            block, warps = valid_config(json.loads(cache.read_text(path) or "null")["config"])
        except (ValueError, KeyError, TypeError) as err:
            if path.exists():
                logs.cache.warning("tuning record %s is not usable (%s); measuring again", path.name, err)
            return None
        logs.cache.info("tuned launch config for %s from %s: %s x %s warps", self.name, path, block, warps)
        return block, warps

    def configs(self) -> list[tuple[int, int]]:
        """The configurations the first call chooses from: the heuristic's (a small kernel), the
        remembered choice, or the candidates to time (each once; one alone needs no timing)."""
        if not self.tuned():
            return [self.heuristic()]
        remembered = self._remembered_config()
        return [remembered] if remembered is not None else list(dict.fromkeys(self.candidates()))

    def choose(self, args) -> tuple[int, int]:
        """The launch configuration: of `configs` (as `prepare` found them, under the compile's
        settings, else now), the fastest on these arguments, remembered on disk."""
        configs = self._configs or self.configs()
        if len(configs) > 1:  # a kernel of the same skeleton may have been tuned since `prepare`
            remembered = self._remembered_config()
            configs = [remembered] if remembered in configs else configs
        if len(configs) == 1:
            return configs[0]
        path = self._tuning_path()
        private = _unaliased(args)
        times = {candidate: self._time(candidate, private) for candidate in configs}
        best = min(times, key=times.get)
        logs.fusion.info(
            "%s: launch configs %s -> %s", self.name, {f"{b}x{w}": f"{ms:.3f} ms" for (b, w), ms in times.items()}, best
        )
        cache.write_atomic(
            path, json.dumps({"config": list(best), "ms": {f"{b}x{w}": ms for (b, w), ms in times.items()}})
        )
        return best

    def _per_part(self, block: int) -> int:
        """BLOCK_SIZE for `block` elements a program when each offset writes `parts` of them
        (a power of two, as tl.arange needs: 3 parts of 1024 elements get 256 offsets)."""
        return max(1 << ((block // self.parts).bit_length() - 1), 16)

    def _time(self, config, args) -> float:
        """Milliseconds of one run at `config`: the median of TIMED_RUNS runs, each between two CUDA
        events, queued behind a GPU sleep so that the launches wait on the GPU, not the GPU on
        them (the events then time the kernel, not Python's launch path). Triton's do_bench took
        ~30-50 ms a candidate (an L2 flush per run, its own estimate loop): 2-4 s of the decoder
        block's first training step, 69 candidates; this takes a few milliseconds each."""
        block, warps = config
        grid = (self.grid(block),)
        run = lambda: self.kernel[grid](*args, **self._settings(block, warps))  # noqa: E731
        run()  # compiled ahead (`prepare`), else compiles here, outside the timed runs
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(TIMED_RUNS)
        ]
        torch.cuda._sleep(QUEUE_CYCLES)
        for start, end in events:
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)

    def _key(self, *parts, skeleton: bool = False) -> str:
        """A hash of this kernel's text (without its name when `skeleton`), the GPU, Triton's
        version, its compile options and `parts`: names files on disk."""
        import triton

        source = self._text()
        source = re.sub(rf"\b{re.escape(self.name)}\b", "KERNEL", source) if skeleton else source
        text = "\n".join(
            [source, torch.cuda.get_device_name(self.device), triton.__version__, repr(sorted(self.options.items()))]
            + [repr(p) for p in parts]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def _text(self) -> str:
        """The kernel's source and that of each @triton.jit function it calls (a combined launch's
        parts, a reduction's helpers): what its binary is made of, so what a record of it must be
        named by. (A combined launch's own text names its parts but does not hold them: two
        modules' combos of the same text may call different parts.)"""
        import triton

        source, names = self.kernel.src, getattr(getattr(self.kernel, "fn", None), "__globals__", {})
        called = sorted(set(re.findall(r"\b(\w+)\(", source)))
        parts = [
            names[n].src for n in called if isinstance(names.get(n), triton.JITFunction) and names[n] is not self.kernel
        ]
        return "\n".join([source, *parts])

    # -- compiling ahead of the first call ---------------------------------------
    def prepare(self, signature: list) -> None:
        """Start compiling this kernel for a call with `signature` (each argument's torch.dtype
        for a tensor, the int itself for an integer) in `compile_pool.pool()`: one task per
        configuration the first call may choose, each loading the binary a record names or
        compiling it through Triton's JIT (`warmup`), then loading it onto the GPU. Pointers
        are assumed 16-byte aligned, as fresh allocations are; a first call where one is not
        compiles as before. Settings are read here, in the caller's thread."""
        if self.device.type != "cuda" or self._fast is not None or self._ahead_tasks:
            return
        try:
            configs = self.configs()
            compile_pool.triton_started(self.device.index or 0)  # its driver is made once, not by two threads
            self.kernel.device_caches[self.device.index or 0]  # made once here: the tasks share Triton's JIT cache
            kinds = _kinds(signature)
            pool = compile_pool.pool()
        except Exception as err:  # noqa: BLE001 - nothing ahead: the first call compiles, as without prepare
            logs.cache.info("%s: not compiled ahead (%s: %s)", self.name, type(err).__name__, err)
            return
        self._configs, self._ahead_kinds = configs, kinds
        self._ahead_aligned = {i for i, v in enumerate(signature) if isinstance(v, torch.dtype)}
        self._ahead_tasks = [pool.submit(self._compile_ahead, c, signature, kinds) for c in configs]

    def _compile_ahead(self, config: tuple[int, int], signature: list, kinds: list[str]) -> None:
        """One task of `prepare` (in a pool thread): a failure is only logged, and the first call
        compiles that configuration itself, where the error reaches the user's fallback policy."""
        try:
            with torch.cuda.device(self.device):
                path = self._record_path(config, kinds)
                compiled, through_jit = self._restore(path, self._ahead_aligned), False
                if compiled is None:
                    compiled = self.kernel.warmup(*signature, grid=(1,), **self._settings(*config))
                    compiled._init_handles()  # its launcher built and the binary loaded, here too
                    through_jit = True
                    self._remember(compiled, path, self._ahead_aligned)
                self._ahead[config] = (compiled, through_jit)
        except Exception as err:  # noqa: BLE001 - the first call compiles it and reports
            logs.cache.info("%s: compile ahead of %s failed (%s: %s)", self.name, config, type(err).__name__, err)


def _inside_triton_cache(group: dict) -> None:
    """A kernel record points at files in Triton's cache, never anywhere else."""
    from pathlib import Path

    from triton import knobs

    root = Path(knobs.cache.dir).resolve()
    for path in group.values():
        if not Path(path).resolve().is_relative_to(root):
            raise ValueError(f"{path} lies outside Triton's cache {root}")


def _unaliased(args) -> list:
    """The arguments with each tensor that shares memory with another replaced by a copy: tuning
    runs the kernel many times, and one that writes an output over a buffer it reads (in place,
    codegen/module.py `_hosts`) would read its own results from the second run on."""
    storages = collections.Counter(a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor))

    def private(a):
        if not isinstance(a, torch.Tensor) or storages[a.untyped_storage().data_ptr()] == 1:
            return a
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)

    return [private(a) for a in args]


def _kinds(values) -> list[str]:
    """What Triton specializes each argument on besides alignment: a tensor's dtype (a tensor or,
    compiling ahead, its torch.dtype) and an integer's `_int_class`."""
    return [
        str(v.dtype)
        if isinstance(v, torch.Tensor)
        else str(v)
        if isinstance(v, torch.dtype)
        else _int_class(v)
        if isinstance(v, int)
        else type(v).__name__
        for v in values
    ]


def _int_class(value: int) -> str:
    """What Triton's JIT specializes an integer argument on."""
    kind = "one" if value == 1 else "multiple of 16" if value % 16 == 0 else "any"
    return f"int {kind} {'i32' if -(2**31) <= value < 2**31 else 'i64'}"


def _aligned_positions(args) -> set[int]:
    """Positions of tensor arguments whose data is 16-byte aligned (Triton specializes on it)."""
    return {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.data_ptr() % 16 == 0}


def _bind(compiled, grid: int, block: int, device_index: int, aligned: set[int], fallback):
    """A function that launches `compiled` on the current stream, arguments as given.

    `compiled` assumed the pointers at `aligned` are 16-byte aligned; a call
    where one is not (a view at an odd offset) goes through Triton's JIT instead.
    """
    launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    current_stream = torch._C._cuda_getCurrentRawStream
    current_device = torch._C._cuda_getDevice
    check = tuple(sorted(aligned))
    if getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0:
        # no scratch memory to allocate per launch: call the C launcher under Triton's Python wrapper
        c_launch, cooperative, pdl = launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl

        def launch(stream, args):
            c_launch(
                grid, 1, 1, stream, function, cooperative, pdl, None, None, metadata, None, None, None, *args, block
            )
    else:

        def launch(stream, args):
            launcher(grid, 1, 1, stream, function, metadata, None, None, None, *args, block)

    def fast(*args):
        if current_device() != device_index:  # launches go to the current device's context
            with torch.cuda.device(device_index):
                return fast(*args)
        for i in check:
            if args[i].data_ptr() % 16:
                return fallback(args)
        return launch(current_stream(device_index), args)

    return fast
