"""minicomp: a small compiler that fuses pointwise PyTorch code into Triton kernels.

    @minicomp.jit
    def bias_gelu(x, b): ...

See README.md for the pipeline and how to look at every stage.
"""
from minicomp.api import CompileError, JitFunction, jit

__all__ = ["CompileError", "JitFunction", "jit"]
__version__ = "0.1.0"
