"""Every setting minicomp reads, in one place: environment variables and tunables, each validated.

    MINICOMP_CACHE_DIR          where generated modules and the persistent index live
                                (default $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp)
    MINICOMP_DEBUG_DIR          also keep a copy of every generated module there
    MINICOMP_FALLBACK           warn | silent | raise: what a signature that cannot compile does
    MINICOMP_CACHE_LIMIT        signatures kept per function (a whole number >= 1; default 64)
    MINICOMP_RECOMPILE_WARNING  warn once a function has compiled this many signatures (>= 1; default 8)
    MINICOMP_LOGS               log channels (logs.py)
    MINICOMP_COMPILE_THREADS    threads that compile kernels ahead of their first call (compile_pool.py;
                                a whole number >= 1; default: the CPU count, at most 32)
    MINICOMP_COMPILE_PROCESSES  worker processes those threads hand Triton's compiles to (compile_processes.py;
                                a whole number >= 0, 0: the threads compile; default: as many as threads, <= 16)
    MINICOMP_MATMUL             auto | template | library: mm/addmm/bmm as a Triton template with its
                                epilogue fused, or as ATen (cuBLAS) calls (plan/matmul.py; default library;
                                on CUDA one row times a weight read along K is a template in each: matmul_rows)

A value that does not parse raises `ConfigError` with a one-line message when
the setting is first needed (at `jit`, not at `import minicomp`).

Tunables of the compiler (not environment variables) live here too, so that
experiments and tests change them through `override(...)` instead of patching
module globals:

    with config.override(max_parts=1):      # no walking in parts (codegen/parts.py)
        ...
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


class ConfigError(ValueError):
    """An environment variable or setting minicomp cannot use."""


FALLBACKS = ("warn", "silent", "raise")


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _whole_number(name: str, default: int, minimum: int = 1) -> int:
    text = _env(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, not {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, not {text!r}")
    return value


def cache_dir() -> Path:
    """MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp (absolute)."""
    explicit = _env("MINICOMP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().absolute()
    base = _env("XDG_CACHE_HOME") or Path.home() / ".cache"
    return (Path(base) / "minicomp").expanduser().absolute()


def templates_directory() -> Path:
    """The Jinja2 templates: inside the installed package (a wheel ships them as package data,
    mapped from the repository's top-level `templates/`), else beside the package in a checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "templates", package.parent / "templates"):
        if (candidate / "module.py.j2").is_file():
            return candidate
    raise FileNotFoundError(f"minicomp's templates are neither in {package} nor beside it")


def debug_dir() -> Path | None:
    text = _env("MINICOMP_DEBUG_DIR")
    return None if text is None else Path(text).expanduser()


def fallback(explicit: str | None = None) -> str:
    """The fallback policy: `explicit` (jit's argument) if given, else MINICOMP_FALLBACK, else warn."""
    value = explicit if explicit is not None else (_env("MINICOMP_FALLBACK") or "warn")
    if value not in FALLBACKS:
        source = "fallback" if explicit is not None else "MINICOMP_FALLBACK"
        raise ConfigError(f"{source} must be one of {', '.join(FALLBACKS)}, not {value!r}")
    return value


def cache_limit() -> int:
    return _whole_number("MINICOMP_CACHE_LIMIT", 64)


def compile_threads() -> int:
    return _whole_number("MINICOMP_COMPILE_THREADS", min(32, os.cpu_count() or 1))


def compile_processes() -> int:
    return _whole_number("MINICOMP_COMPILE_PROCESSES", min(16, compile_threads()), minimum=0)


def recompile_warning() -> int:
    return _whole_number("MINICOMP_RECOMPILE_WARNING", 8)


def log_channels() -> str:
    return _env("MINICOMP_LOGS") or ""


# -- tunables ---------------------------------------------------------------------

DEFAULTS = dict(
    max_parts=4,  # codegen/parts.py: a dim walked in at most this many parts
    lean_training=True,  # training_call.py: a simple training signature's later calls skip AOTAutograd's runtime
    launch_candidates=((512, 4), (1024, 4), (2048, 4)),  # launch.py: (BLOCK_SIZE, num_warps) timed on large kernels
    tune_min_numel=1 << 24,  # launch.py: kernels below this use the heuristic
    reuse_bytes=16 << 20,  # codegen/plane_order.py: a broadcast input read again over this many bytes later ...
    plane_group=32,  # ... has its planes walked this many side by side
    persistent_rows=8192,  # reduction_space.py: a reduced row up to this many elements ...
    persistent_bytes=1024,  # ... and bytes of its widest input is held in registers whole
    loop_block=4096,  # fusion.py: elements of a longer row a looped reduction takes per step
    peel_below=8,  # codegen/reduction.py: a looped row whose length is no multiple of this takes its last step apart
    scan_block=2048,  # plan/scan.py: elements of a longer row a looped scan takes per step
    outer_block=32,  # fusion.py: elements of a row a step when the rows are contiguous in memory
    split_below=256,  # split_reductions.py: a reduction with fewer row tiles (~2 per SM) is split ...
    split_min_numel=1 << 20,  # split_reductions.py: ... when it reads at least this many elements ...
    split_tile_numel=1 << 16,  # split_reductions.py: ... or one program would walk at least this many ...
    apart_bytes=1 << 24,  # apart.py: values sharing no load, one reading a computed buffer this large, run apart
    split_programs=4096,  # split_reductions.py: ... into about this many row tiles x partials ...
    split_chunk=128,  # split_reductions.py: ... of at least this many elements each
    group_programs=256,  # split_reductions.py: a column reduction beside a row kernel: about this many partials ...
    group_min_rows=16,  # split_reductions.py: ... each summing at least this many rows
    pad_matmuls="auto",  # pad_matmuls.py: "auto" (timed on CUDA), "always", "never": misaligned matmul sizes padded ...
    pad_min_macs=1 << 27,  # pad_matmuls.py: ... in "auto", a matmul of at least this many multiply-adds
    measure_matmuls=True,  # matmul_timing.py, matmul_choice.py: a choice no record holds is timed (off: no pad, ATen)
    matmul="library",  # plan/matmul.py: "auto", "template", "library" (env MINICOMP_MATMUL): how mm/addmm/bmm run ...
    matmul_min_macs=1 << 24,  # plan/matmul.py: ... in "auto" on CUDA, a matmul of this many multiply-adds ...
    matmul_max_macs=1 << 36,  # plan/matmul.py: ... up to this many is timed as a template (else ATen)
    matmul_rows=True,  # plan/matmul.py: on CUDA, in "library" and "auto" (not "template": all), one row along K ...
    matmul_row_min_k=512,  # plan/matmul.py: ... of at least this K runs as the template's one-row form (a GEMV)
    matmul_chain_width=128,  # plan/matmul_folding.py: an MLP chained into one kernel up to this hidden width
    matmul_siblings=False,  # plan/matmul_folding.py: a template computes the other products its epilogue reads (slower)
    static_share=0.75,  # static_parts.py: a dynamic inference graph cut where this share of its compute is static
    cuda_graphs=False,  # runtime/graphs.py: each compiled signature replayed as a CUDA graph (reduce-overhead) ...
    cuda_graph_limit=16,  # runtime/graphs.py: ... at most this many graphs kept per model ...
    cuda_graph_rerecords=8,  # runtime/graphs.py: ... one callable's recorded again this often (static inputs moved)
    chunk_budget_bytes=0,  # row_regions.py: a product only row reductions read, by chunks that fit this (0: whole)
    compile_processes_from=8,  # runtime/compile_processes.py: worker processes compile once this many are outstanding
    recompute_for_memory=True,  # partition.py: the backward recomputes cheap pointwise values, expanding products
    pause_gc=True,  # gc_pause.py: Python's cyclic garbage collector paused while minicomp compiles
    probe_sizes=True,  # specialize.py: a dynamic graph written at a probe size before its first, families widened
)
ENVIRONMENT = {"matmul": "MINICOMP_MATMUL"}  # tunables an environment variable sets (under any override)
_overrides = threading.local()


def get(name: str):
    """The current value of tunable `name` (an `override` in this thread, else its default)."""
    if name not in DEFAULTS:
        raise ConfigError(f"no tunable named {name!r}; choose from {', '.join(DEFAULTS)}")
    stack = getattr(_overrides, "stack", [])
    for layer in reversed(stack):
        if name in layer:
            return layer[name]
    if name in ENVIRONMENT and (value := _env(ENVIRONMENT[name])) is not None:
        return value
    return DEFAULTS[name]


def checked(name: str, value):
    """`value` for tunable `name` (torch.compile's options) when it has the default's type (an int
    where a float is, too) and is no negative size where the default is a size; else ConfigError."""
    default = DEFAULTS[name]
    kinds = (int, float) if type(default) is float else (type(default),)
    if default is not None and (not isinstance(value, kinds) or (type(default) is int and isinstance(value, bool))):
        raise ConfigError(f"backend 'minicomp': option {name!r} takes a {type(default).__name__}, not {value!r}")
    if type(default) is int and default >= 0 and value < 0:
        raise ConfigError(f"backend 'minicomp': option {name!r} takes a value >= 0, not {value!r}")
    return value


def current() -> dict:
    """Every tunable's value in this thread: what a compile started later in another thread (a
    backward, which autograd runs on its device thread for a GPU) is given through `override`."""
    return {name: get(name) for name in DEFAULTS}


@contextlib.contextmanager
def override(**values):
    """Change tunables inside a `with` block (this thread only)."""
    unknown = set(values) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"no tunable named {sorted(unknown)}; choose from {', '.join(DEFAULTS)}")
    stack = getattr(_overrides, "stack", None)
    if stack is None:
        stack = _overrides.stack = []
    stack.append(values)
    try:
        yield
    finally:
        stack.pop()
