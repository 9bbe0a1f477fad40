"""Runtime: what a generated module imports and what loads it. Never the compiler.

launch.py          Launch: one kernel's launches, coordinating the modules below
launch_spec.py     each kernel kind's launch spec (PointwiseLaunch ... RowProductsLaunch): grid, configurations
launch_configs.py  the configurations a kernel is launched with and tuned over
tuning.py          which configuration the first call takes: heuristic, remembered or timed
matmul_timing.py   a matmul timed as planned and padded: does padding pay on this GPU
matmul_choice.py   a matmul template timed against cuBLAS + an epilogue kernel: which runs it ("auto")
size_classes.py    the size classes those measurements are shared by (a new length measures nothing)
records.py         a kernel's records on disk: its compiled binaries and its tuning choice
ahead.py           compiling a kernel ahead of its first call
binding.py         a compiled kernel bound to its C launcher: the call path once compiled
compile_pool.py    the threads kernels compile in ahead of their first call
compile_processes.py  ... and the worker processes those threads hand Triton's compiles to
compile_worker.py  ... one such process (Triton only, run by path: no torch, no minicomp)
loader.py          generated source -> a module in the cache directory, imported
cache.py           the cache directory: private, verified, only its own files
externs.py         an extern call's real output held to the planned layout (conform)
allocate.py        buffers and views of a generated call, by torch's C++ fast paths
interpreter_math.py  libdevice spelled for Triton's interpreter (CPU tensors)
interpreter_index.py  ... and a runtime integer as a loop bound there (numpy 2)
interpreter_reduce.py ... and `tl.reduce` with a kernel's own combine function as a tree there
checks.py          device-side asserts in kernels (bounds, division by zero): raised as eager does
graphs.py          CUDA graphs of compiled callables: recorded per signature, replayed (opt-in)
graph_capture.py   ... their device side: side stream, memory pool, warm-up and capture
graph_inputs.py    ... what a replay reads: inputs in place while they stay, else in buffers
graph_outputs.py   ... what a replay hands back: outputs uncopied, held ones moved out
"""

from minicomp.runtime.allocate import empty_cuda, over_or_empty, reinterpret
from minicomp.runtime.externs import ExternMismatch, aligned, conform
from minicomp.runtime.launch import Launch, Reentered, interpreting
from minicomp.runtime.launch_spec import (
    CombinedLaunch,
    MatmulLaunch,
    PointwiseLaunch,
    ReductionLaunch,
    RowProductsLaunch,
    ScatterLaunch,
)
from minicomp.runtime.loader import forget_loaded, load, module_name, module_path, source_hash

__all__ = [
    "CombinedLaunch",
    "ExternMismatch",
    "Launch",
    "MatmulLaunch",
    "RowProductsLaunch",
    "aligned",
    "conform",
    "empty_cuda",
    "over_or_empty",
    "reinterpret",
    "PointwiseLaunch",
    "ReductionLaunch",
    "Reentered",
    "ScatterLaunch",
    "interpreting",
    "forget_loaded",
    "load",
    "module_name",
    "module_path",
    "source_hash",
]
