"""Code generation: a fusion plan -> one Python module of Triton kernels and a wrapper.

`render_module` (module.py) loads on first use: a process served from the persistent
cache never generates code, and importing the writers, the lowering table and the
templates costs it time at start-up.

Each kernel kind has its writer: pointwise.py, reduction.py, scatter.py (atomic adds at the
indexes a tensor holds); kernel.py is what they share, module.py the wrapper around them.
"""

__all__ = ["render_module"]


def __getattr__(name: str):
    if name == "render_module":
        from minicomp.codegen.module import render_module

        return render_module
    raise AttributeError(f"module 'minicomp.codegen' has no attribute {name!r}")
