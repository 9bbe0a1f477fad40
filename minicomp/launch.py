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

Launch configuration, measured on an H200 (benchmarks/experiments/):
  * kernels under 16M elements: 1024 elements per program and 4 warps (8
    elements, two 16-byte float32 vectors, per thread); tiny ones one program.
  * larger kernels: the best of config "launch_candidates", timed on the first call's real
    arguments and remembered on disk (`<cache>/tuning/`), so a second process
    reuses the choice. The spread is real: RoPE in bf16 ran 1.09x the memory
    floor at 1024/4 and 1.03x at 512/4, while bias+ReLU in bf16 went the
    other way (1.08x and 1.34x).
  * Triton's interpreter (CPU) runs one program at a time in numpy: few, large
    programs are fastest there.
  * a kernel walked in parts (codegen/split.py) writes `parts` elements per
    offset: its BLOCK_SIZE is the configuration's divided by `parts`, so that a
    program handles the same number of elements.
  * a reduction kernel (`row` = its RBLOCK) is launched over rows: its block is
    XBLOCK, the rows a program takes; `reduction_heuristic` and
    `reduction_candidates` below, tuned the same way. A grouped one (`groups`
    programs, split_reductions.py) takes its group's rows XBLOCK at a time:
    its grid is fixed, XBLOCK is chosen for the group.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import types

import torch

from minicomp import cache, config, logs

# Triton's interpreter patches triton.language module-wide while a kernel runs: two threads
# interpreting at once undo each other's patches ("Did you forget to add @triton.jit ?").
_INTERPRETER_LOCK = threading.Lock()
WARPS = (1, 2, 4, 8, 16, 32)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def heuristic(numel: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) without measuring."""
    if device.type == "cpu":
        return min(max(next_power_of_2(numel), 16), 1 << 16), 1
    if numel <= 4096:
        return max(next_power_of_2(numel), 128), 4 if numel > 1024 else 1
    return 1024, 4


def reduction_heuristic(rows: int, row: int, device: torch.device) -> tuple[int, int]:
    """(XBLOCK, num_warps) of a reduction kernel whose programs hold `row` elements of a row."""
    if device.type == "cpu":
        return min(next_power_of_2(max(rows, 1)), max(1, (1 << 16) // row)), 1
    xblock = rows_per_program(rows, row)
    return xblock, min(16, max(1, xblock * row // 512))


def rows_per_program(rows: int, row: int) -> int:
    """XBLOCK without measuring: a tile of about 2048 elements, `row` of each row."""
    return min(next_power_of_2(max(rows, 1)), max(1, 2048 // row))


def reduction_candidates(rows: int, row: int) -> list[tuple[int, int]]:
    """The (XBLOCK, num_warps) a reduction kernel is timed with: tiles of up to 8192 elements
    (rows a program from the largest such down to a quarter of it), warps for 256 to 2048
    elements of the tile a warp. The range is measured (benchmarks/experiments/reduction_configs.py,
    H200): cross-entropy's looped rows are fastest at 2048 a warp, RMSNorm's persistent ones and
    column sums at 256-1024."""
    top = min(next_power_of_2(max(rows, 1)), max(1, 8192 // row))
    found = []
    for xblock in (top, top // 2, top // 4):
        if xblock < 1:
            continue
        for per_warp in (2048, 1024, 512, 256):
            warps = min(32, max(1, xblock * row // per_warp))
            if (xblock, warps) not in found:
                found.append((xblock, warps))
    return found


class Launch:
    """One kernel of a generated module, launched as cheaply as Triton allows."""

    def __init__(self, kernel, numel: int, device: str, parts: int = 1, row: int = 0, extent: int = 0, groups: int = 0):
        self.kernel, self.numel, self.device = kernel, numel, torch.device(device)
        self.parts = parts  # elements written per offset
        self.row = row  # a reduction kernel's RBLOCK (numel then counts rows), else 0
        self.extent = extent  # a reduction kernel's row length (its work is numel * extent)
        self.groups = groups  # a grouped reduction kernel's programs: each takes its rows XBLOCK at a time
        self.block_name = "XBLOCK" if row else "BLOCK_SIZE"
        self.name = kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__
        self.config: tuple[int, int] | None = None
        self._fast = None  # the bound launcher, once the kernel is compiled
        self.times: dict[str, float] = {}  # the first call's tuning and compile (or load) seconds
        self.jit_compiled: bool | None = None  # the first call compiled through Triton's JIT (else loaded)
        self._lock = threading.Lock()

    def grid(self, block: int) -> int:
        return self.groups or -(-self.numel // block)

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
                self.kernel[(self.grid(block),)](*args, **{self.block_name: block}, num_warps=warps)
            return None
        return self._first_call(args)

    def _jit_launch(self, args):
        """Through Triton's JIT: it specializes on the arguments and caches the binaries."""
        block, warps = self.config
        return self.kernel[(self.grid(block),)](*args, **{self.block_name: block}, num_warps=warps)

    def _first_call(self, args):
        with self._lock, torch.cuda.device(self.device):
            start = time.perf_counter()
            if self.config is None:
                self.config = self.choose(args)
            tuned = time.perf_counter()
            aligned = _aligned_positions(args)
            compiled = self._restore(args, aligned)
            ran = compiled is None
            if ran:  # Triton's JIT compiles (or loads its disk cache) and runs this call
                compiled = self._jit_launch(args)
                self._remember(compiled, args, aligned)
            self.times = {"tune": tuned - start, "compile": time.perf_counter() - tuned}
            self.jit_compiled = ran
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
    def _record_path(self, args):
        """One record per binary: kernel text, launch config, and what Triton specializes
        on besides alignment: each tensor's dtype, and of each integer (n_elements and
        the runtime sizes of codegen/families.py) whether it is 1, a multiple of 16, and
        32 or 64 bits. Sizes themselves are not part of it, so a new batch size or
        sequence length reuses the binary."""
        block, warps = self.config
        kinds = [
            str(a.dtype) if isinstance(a, torch.Tensor) else _int_class(a) if isinstance(a, int) else type(a).__name__
            for a in args
        ]
        return cache.file("kernels", f"{self.name}_{self._key(f'{block}x{warps}', kinds)}.json")

    def _remember(self, compiled, args, aligned) -> None:
        try:
            record = dict(
                hash=compiled.hash,
                metadata_group=compiled.metadata_group,
                aligned=sorted(aligned),
                signature=dict(compiled.src.signature),
                constants=[[list(k), v] for k, v in compiled.src.constants.items()],
            )
            cache.write_atomic(self._record_path(args), json.dumps(record))
        except (AttributeError, TypeError, ValueError, OSError) as err:  # not restorable: the JIT path stays
            logs.cache.info("%s: compiled kernel not remembered (%s)", self.name, err)

    def _restore(self, args, aligned):
        """The compiled kernel of an earlier process, or None (then Triton's JIT compiles or loads it)."""
        try:
            path = self._record_path(args)
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

    def choose(self, args) -> tuple[int, int]:
        elements = self.numel * max(self.parts, self.row, self.extent)
        if elements < config.get("tune_min_numel"):
            return self.heuristic()
        path = cache.file("tuning", f"{self.name}_{self._key(self.numel)}.json")
        try:
            block, warps = _valid_config(json.loads(cache.read_text(path) or "null")["config"])
            logs.cache.info("tuned launch config for %s from %s: %s x %s warps", self.name, path, block, warps)
            return block, warps
        except (ValueError, KeyError, TypeError) as err:
            if path.exists():
                logs.cache.warning("tuning record %s is not usable (%s); measuring again", path.name, err)
        times = {candidate: self._time(candidate, args) for candidate in self.candidates()}
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
        import triton.testing

        block, warps = config
        grid = (self.grid(block),)
        run = lambda: self.kernel[grid](*args, **{self.block_name: block}, num_warps=warps)  # noqa: E731
        run()  # compile outside the timed region
        return triton.testing.do_bench(run, warmup=5, rep=25, return_mode="median")

    def _key(self, *parts) -> str:
        """A hash of this kernel's text, the GPU, Triton's version and `parts`: names files on disk."""
        import triton

        text = "\n".join(
            [self.kernel.src, torch.cuda.get_device_name(self.device), triton.__version__] + [repr(p) for p in parts]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def _valid_config(value) -> tuple[int, int]:
    """(BLOCK_SIZE or XBLOCK, num_warps) read from a tuning record, checked: a power of two up to
    65536 and a warp count Triton accepts; anything else raises ValueError."""
    block, warps = value
    if (
        type(block) is not int
        or type(warps) is not int
        or not 1 <= block <= 1 << 16
        or block & (block - 1)
        or warps not in WARPS
    ):
        raise ValueError(f"launch config {value!r} is not a power-of-two block and a warp count")
    return block, warps


def _inside_triton_cache(group: dict) -> None:
    """A kernel record points at files in Triton's cache, never anywhere else."""
    from pathlib import Path

    from triton import knobs

    root = Path(knobs.cache.dir).resolve()
    for path in group.values():
        if not Path(path).resolve().is_relative_to(root):
            raise ValueError(f"{path} lies outside Triton's cache {root}")


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
