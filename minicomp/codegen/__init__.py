"""Code generation: a fusion plan -> one Python module of Triton kernels and a wrapper.

`render_module` (module.py) loads on first use: a process served from the persistent
cache never generates code, and importing the writers, the lowering table and the
templates costs it time at start-up.

Each kernel kind has its writer: pointwise.py, reduction.py, scatter.py (atomic adds at the
indexes a tensor holds), matmul.py (a tl.dot template, its epilogue in the store; one row without
tl.dot); kernel.py is what they share, module.py the wrapper around them; alike.py says which
kernels of a module are the same but for their names (one Launch for them: identical layers
compile once); combo.py and row_products.py put independent pointwise kernels, and one-row
templates, in one launch.
"""

__all__ = ["render_module"]


def __getattr__(name: str):
    if name == "render_module":
        from minicomp.codegen.module import render_module

        return render_module
    raise AttributeError(f"module 'minicomp.codegen' has no attribute {name!r}")
