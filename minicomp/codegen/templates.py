"""The Jinja2 templates generated code is written from: the repository's top-level `templates/`.

    module.py.j2      a generated module: docstring (graph, plan), kernels, `call`
    combine.py.j2     the @triton.jit helpers reductions combine partial results with (included)
    pointwise.py.j2   a pointwise kernel: one flat index space, 1-D grid
    reduction.py.j2   a reduction kernel: rows of a reduction space, XBLOCK rows a program
    combo.py.j2       two independent pointwise kernels in one launch (codegen/combo.py)
    matmul.py.j2      a matmul: tl.dot over K a tile a program (one row: without), the epilogue's lines before its store
    row_products.py.j2  one-row matmuls in one launch, each piece's programs after the previous one's

A wheel ships them as package data in `minicomp/templates/` (pyproject.toml maps that
package to `templates/`); a source checkout finds them beside the package.
"""

from __future__ import annotations

import jinja2

from minicomp import config

DIRECTORY = config.templates_directory()
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(DIRECTORY),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
