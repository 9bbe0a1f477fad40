"""What a dynamic training graph's forward at one size agrees with its backward at that size.

A static training graph's forward leaves the values only its backward reads at the strides its
plan gives them (saved_layouts.py: a padded product's slice, GPT-2's logits, not copied out), and
its backward may write over a saved value it reads for the last time (donations.py). Both are
agreements between one compiled forward and one compiled backward. A dynamic graph compiles a
forward and a backward per size (capture/specialize.py), each at its first call at that size:
`Contracts` carries what each size's forward produced to that size's backward, matched by the
shapes of the values the backward reads from the forward (a size's saved activations).

A backward that finds no agreement (a forward traced again with its nodes renamed, two forwards
of one set of saved shapes that produced otherwise) takes its saved inputs in eager's layout,
copied into it where one arrives otherwise, and donates nothing.
"""

from __future__ import annotations

import dataclasses

import torch

from minicomp.dispatch import saved_layouts


@dataclasses.dataclass(frozen=True)
class Produced:
    """A compiled forward's side of the agreement: the saved values it lays out unlike the traced
    graph ({name: (shape, stride)}, saved_layouts.produced) and those whose memory is theirs alone
    (donations.exclusive_outputs)."""

    layouts: dict
    exclusive: frozenset[str]


class Contracts:
    """Per set of saved shapes, what the forward compiled for it produced (None where two forwards
    of those shapes disagreed: a backward compiled on the first one's word then runs as captured,
    `relied_on`)."""

    def __init__(self):
        self._by_shapes: dict[tuple, Produced | None] = {}

    def forward_compiled(self, static: torch.fx.GraphModule, saved: frozenset[str], produced: Produced) -> None:
        key = _shapes(static, saved, outputs=True)
        if key is None:
            return
        if key in self._by_shapes and self._by_shapes[key] != produced:
            self._by_shapes[key] = None  # ambiguous: no backward of these shapes relies on either
            return
        self._by_shapes[key] = produced

    def for_backward(self, static: torch.fx.GraphModule, saved: frozenset[str]) -> tuple[tuple | None, Produced | None]:
        """(the key of this backward's saved shapes, what its forward produced, or None)."""
        key = _shapes(static, saved, outputs=False)
        return key, None if key is None else self._by_shapes.get(key)

    def relied_on(self, boxed, key: tuple, captured):
        """`boxed` (a backward compiled on the word of the forward of `key`), running `captured`
        (its graph as Dynamo captured it: guarded_calls.captured, which writes over nothing) once
        another forward of those saved shapes has produced otherwise: the values may be that
        one's, whose memory may not be the backward's to take."""

        def run(args):
            if self._by_shapes.get(key) is None:
                return captured(args)
            return boxed(args)

        run._boxed_call = True  # AOTAutograd's mark: it passes its argument list
        return run


def saved_tensors(gm: torch.fx.GraphModule, saved: frozenset[str]) -> frozenset[str]:
    """Those of `saved` (the dynamic forward `gm`'s values its backward reads) that are tensors,
    not sizes (a size is a number in each size's graph)."""
    return frozenset(n.name for n in gm.graph.nodes if n.name in saved and isinstance(n.meta.get("val"), torch.Tensor))


def backward_checks(
    static: torch.fx.GraphModule, input_names: list[str], produced: Produced | None, strided: frozenset[str]
) -> list[tuple[int, tuple, tuple]]:
    """The (position, shape, stride) each saved input of this size's backward `static` must arrive
    in (saved_layouts.conformed): the forward's layout where `produced` says it and the graph takes
    it (saved_layouts.laid_out, which lays the graph out for it), else the traced one, for each
    input the forward may lay out otherwise (`strided`: the forward's saved_layouts.any_layout).
    `input_names`: the dynamic graph's names of `static`'s inputs, position by position (a graph
    traced again names its nodes anew)."""
    checks = saved_layouts.laid_out(static, produced.layouts) if produced and produced.layouts else []
    placeholders = [n for n in static.graph.nodes if n.op == "placeholder"]
    covered = {i for i, _, _ in checks}
    for i, (node, name) in enumerate(zip(placeholders, input_names)):
        value = node.meta.get("val")
        if name in strided and i not in covered and isinstance(value, torch.Tensor):
            checks.append((i, tuple(value.shape), tuple(value.stride())))
    return checks


def _shapes(static: torch.fx.GraphModule, saved: frozenset[str], outputs: bool) -> tuple | None:
    """((name, shape), ...) of the saved tensors `saved` (saved_tensors) in `static`: a forward's
    outputs, a backward's inputs; None where one is missing (a graph traced again, its nodes named
    anew) or is no tensor."""
    if outputs:
        args = next(reversed(static.graph.find_nodes(op="output"))).args[0]
        nodes = {a.name: a for a in args if isinstance(a, torch.fx.Node)}
    else:
        nodes = {n.name: n for n in static.graph.find_nodes(op="placeholder")}
    found = []
    for name in sorted(saved):
        node = nodes.get(name)
        if node is None:
            return None
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return None
        found.append((name, tuple(value.shape)))
    return tuple(found)
