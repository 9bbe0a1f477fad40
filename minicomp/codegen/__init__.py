"""Code generation: a fusion plan -> one Python module of Triton kernels and a wrapper."""

from minicomp.codegen.module import render_module

__all__ = ["render_module"]
