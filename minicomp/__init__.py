"""minicomp: a small compiler that fuses pointwise PyTorch code into Triton kernels.

    @minicomp.jit
    def bias_gelu(x, b): ...

See README.md for the pipeline and how to look at every stage.
"""

from minicomp.api import CompileError, JitFunction, jit
from minicomp.config import ConfigError
from minicomp.explain import explain
from minicomp.logs import set_logs

__all__ = ["CompileError", "ConfigError", "JitFunction", "explain", "jit", "set_logs"]
__version__ = "0.1.0"
