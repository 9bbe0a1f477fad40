"""`minicomp.jit`: the one entry point that takes functions and modules alike."""

from __future__ import annotations

import torch

from minicomp.dispatch.fallback import CompileError
from minicomp.dispatch.function import JitFunction
from minicomp.dispatch.modules import JitModule

__all__ = ["CompileError", "JitFunction", "JitModule", "jit"]


def jit(fn=None, *, fallback: str | None = None, cuda_graphs: bool | None = None):
    """Compile `fn` with minicomp: `@jit`, `@jit(fallback="raise")`, `jit(fn)` or `jit(module)`.

    An `nn.Module` comes back as a module whose forward is compiled, with its
    parameters and buffers as inputs (so gradients reach them).

    fallback: what happens when a signature cannot be compiled: "warn" (run
    eagerly with a warning, the default; env MINICOMP_FALLBACK), "silent", or
    "raise" (CompileError). See fallback.py.

    cuda_graphs: replay each CUDA signature as a CUDA graph (runtime/graphs.py; default config
    "cuda_graphs", off): outputs come back uncopied (runtime/graph_outputs.py: kept ones are moved
    out before the graph writes there again), a module's parameters and buffers are read
    in place, other inputs copied into the graph's buffers.
    """
    if fn is None:
        return lambda f: jit(f, fallback=fallback, cuda_graphs=cuda_graphs)
    if isinstance(fn, torch.nn.Module):
        return JitModule(fn, fallback, cuda_graphs=cuda_graphs)
    return JitFunction(fn, fallback, cuda_graphs=cuda_graphs)
