"""The Jinja2 templates generated code is written from, shipped as package data.

    module.py.j2      a generated module: docstring (graph, plan), kernels, `call`
    pointwise.py.j2   a kernel of kind "pointwise": one flat index space, 1-D grid
    combo.py.j2       two independent pointwise kernels in one launch (codegen/module.py `_combinable`)

One template per kernel kind: a kind's writer (codegen/) fills its template.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

DIRECTORY = Path(__file__).resolve().parent
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(DIRECTORY),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
