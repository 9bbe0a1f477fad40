"""Two adjacent pointwise kernels in one launch (templates/combo.py.j2), and what any kernels that
share a launch must be (`independent`): Inductor's combo kernels. The module's writer
(codegen/module.py) keeps a kernel waiting for a partner; codegen/row_products.py does the same
for one-row matmul templates."""

from __future__ import annotations

from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.pointwise import PointwiseSource
from minicomp.codegen.templates import ENV
from minicomp.plan.steps import Kernel
from minicomp.runtime.launch_spec import CombinedLaunch, LaunchSpec

Piece = tuple[KernelSource, Kernel]  # a kernel's source and its plan step


def combinable(source: KernelSource, reused: dict[str, str]) -> bool:
    """Whether a kernel may share a launch with a neighbour (two iteration spaces, RoPE's q with
    32 heads and k with 8, are two kernels; one launch has one tail, not two): a pointwise
    kernel without runtime sizes (a family member keeps its own launch), not writing in place
    (reuse.py) and walking its blocks in order (codegen/plane_order.py). The caller also asks
    the pair to be independent and to write the same elements per offset (`parts`). The second
    kernel's outputs are then allocated before the first runs."""
    return isinstance(source, PointwiseSource) and not source.sizes and not reused and not source.planes


def independent(first: Kernel, second: Kernel) -> bool:
    """Neither reads what the other writes: their programs may run in any order."""
    return not (set(second.loads) & set(first.stores) or set(first.loads) & set(second.stores))


def same_offsets(first: PointwiseSource, second: PointwiseSource) -> bool:
    """Whether two kernels index alike: both int32 or both int64 offsets, as many parts an offset."""
    return (first.wide_index, first.parts) == (second.wide_index, second.parts)


def combined(pieces: list[Piece], launcher: str, device) -> tuple[str, list[str], tuple, str, LaunchSpec]:
    """(text, buffers, scalars, name, launch spec) of one launch for two pointwise kernels
    (templates/combo.py.j2): each kernel's body becomes a @triton.jit function of its own (its
    names stay its own), called by the programs of its range."""
    buffers = list(dict.fromkeys(b for source, _ in pieces for b in source.args))
    name = "_".join(source.name for source, _ in pieces)[:120]
    numels = tuple(source.numel for source, _ in pieces)
    spec = CombinedLaunch(pieces=numels, parts=pieces[0][0].parts)
    loose = [f"n_elements{i}" for i, (source, _) in enumerate(pieces) if source.numel_param in source.unspecialized]
    text = ENV.get_template("combo.py.j2").render(
        pieces=[source for source, _ in pieces],
        unspecialized=loose,  # a family's count Triton must not specialize on (families.py)
        calls=[[f"{b}_ptr" for b in source.args] for source, _ in pieces],
        name=name,
        params=[f"{b}_ptr" for b in buffers],
        spec=repr(spec),
        launcher=launcher,
        device=str(device),
    )
    return text, buffers, numels, name, spec
