"""Independent one-row matmul templates in one launch (templates/row_products.py.j2).

A decoding step multiplies one row by several weights: a Llama layer's normed row by its q, k and
v projections. Each is a one-row template (codegen/matmul.py), reading its weight once in a few
microseconds; as three launches, each pays its own ramp and tail on the GPU. The module's writer
(codegen/module.py) gathers consecutive one-row templates that may share a launch (`piece`) and
that neither read what another writes (codegen/combo.py `independent`), and launches them: each is
rendered as a @triton.jit function that takes its program id (`piece=True`), at its first tile
(ROW_TILES' default), and the launch's programs are split among them in order (RowProductsLaunch).
A template that its launch would tune (config "tune_min_numel": a vocabulary's head) keeps a
launch of its own.
"""

from __future__ import annotations

import dataclasses

from minicomp.codegen.combo import Piece
from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.matmul import MatmulSource
from minicomp.codegen.templates import ENV
from minicomp.runtime.launch_spec import RowProductsLaunch


def piece(source: KernelSource, reused: dict[str, str]) -> bool:
    """Whether a kernel may share a launch with other one-row templates: the one-row form, not
    tuned by its launch, of fixed sizes (not a family with runtime sizes), writing no input in place."""
    return (
        isinstance(source, MatmulSource)
        and source.row
        and not source.sizes
        and not reused
        and not source.launch_spec().tuned()
    )


def same_warps(first: KernelSource, second: KernelSource) -> bool:
    """Whether two pieces run at the same warps (a launch has one count)."""
    return first.tiles[0][3] == second.tiles[0][3]


def combined(pieces: list[Piece], launcher: str, device) -> tuple[str, list[str], tuple, str, RowProductsLaunch]:
    """(text, buffers, scalars, name, launch spec) of one launch for `pieces` (at least two)."""
    sources = [dataclasses.replace(source, tiles=source.tiles[:1], piece=True) for source, _ in pieces]
    spec = RowProductsLaunch(pieces=tuple(s.launch_spec() for s in sources))
    starts = spec.starts()
    buffers = list(dict.fromkeys(b for s in sources for b in s.args))
    name = "_".join(s.name for s in sources)[:120]
    texts = [
        ENV.get_template(s.template).render(**vars(s), spec="None", launcher="", device=str(device)).rstrip()
        for s in sources
    ]
    calls = [
        dict(name=s.name, args=[f"{b}_ptr" for b in s.args], numel=s.numel, start=starts[i], end=starts[i + 1])
        for i, s in enumerate(sources)
    ]
    text = ENV.get_template("row_products.py.j2").render(
        pieces=texts,
        names=[s.name for s in sources],
        calls=calls,
        name=name,
        params=[f"{b}_ptr" for b in buffers],
        spec=repr(spec),
        launcher=launcher,
        device=str(device),
    )
    return text, buffers, (spec.numel,), name, spec
