"""minicomp: a small compiler that fuses pointwise PyTorch code into Triton kernels.

    @minicomp.jit
    def bias_gelu(x, b): ...

See README.md for the pipeline and how to look at every stage.
"""

from minicomp.config import ConfigError
from minicomp.dispatch.jit import CompileError, JitFunction, jit
from minicomp.logs import set_logs
from minicomp.tools.explain import explain

__all__ = ["CompileError", "ConfigError", "JitFunction", "explain", "jit", "set_logs"]
__version__ = "0.1.0"
