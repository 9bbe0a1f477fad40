"""Expanding products recomputed in the backward instead of saved (issue #41's memory pass).

An attention written out (BERT's, a ViT's, any `q @ k.transpose(-1, -2)`) computes scores
[B * H, S, S] from q and k [B * H, S, d]: a product whose output is S / (2 d) times larger than its
operands together, over a short contraction (d). AOTAutograd's min-cut partition never recomputes
a matmul (`is_compute_intensive`), so it saves the scores, or the softmax of them, for the
backward: at BERT's sizes (S 512, fp32 scores) 96 MiB a layer, the largest saved values of the
step. Yet q and k are saved anyway (the product's own gradients read them), so recomputing the
product in the backward costs no memory, and its flops per element are 2 * d.

`mark` tags each such product of a joint graph PREFER_RECOMPUTE (torch's checkpoint policy,
which the min-cut honours), and with it the values as large as it that forward ops compute from
it element by element (the softmax's shift, exponent and quotient, a mask applied to them):
left free, the cut saves one of those in the scores' place. What it saves instead is what they
read besides (the softmax's row maxima and sums, a few values a row).
The rule:
- an mm or bmm of the forward (no tangent reaches it) whose value the backward reads, itself or
  through forward ops, and that the graph does not return;
- its output at least EXPANSION times the bytes of its operands together;
- a contraction of at most MAX_CONTRACTION elements (the recompute stays cheap: the GPU time of
  a score matrix's write and read is already more than its product's at d = 64).
"""

from __future__ import annotations

import torch
import torch.fx

EXPANSION = 2
MAX_CONTRACTION = 256
PRODUCTS = ("mm.default", "bmm.default")


def mark(graph: torch.fx.Graph) -> list[str]:
    """Tag the expanding products of joint `graph` to be recomputed in the backward (`node.meta`
    "recompute"); the names of those tagged."""
    from torch.utils.checkpoint import CheckpointPolicy

    backward = _after_tangents(graph)
    read_later = _read_by_backward(graph, backward)
    returned = set(graph.output_node().all_input_nodes)  # (the forward has it anyway: a caller's value)
    tagged = []
    for node in graph.nodes:
        if node in backward or node in returned or node not in read_later or not _expanding(node):
            continue
        for value in (node, *_elementwise_after(node, backward)):
            if value in read_later and value not in returned and value.meta.get("recompute") is None:
                value.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE  # (a user's own policy stays)
                tagged.append(value.name)
    return tagged


def _elementwise_after(product: torch.fx.Node, backward: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The forward values as large as `product` computed from it element by element (a softmax's
    shift, exponent and division; a mask applied; a cast), through views: recomputed with it, or
    the cut would save one of them in its place. Views are left to the partition (never saved)."""
    size, found, seen = _numel(product), [], set()
    stack = list(product.users)
    while stack:
        node = stack.pop()
        if node in seen or node in backward or not _elementwise(node):
            continue
        seen.add(node)
        numel = _numel(node)
        if numel is None or size is None or numel < size:
            continue
        if not node.target.is_view:
            found.append(node)
        stack.extend(node.users)
    return found


ELEMENTWISE = ("_to_copy.default", "full_like.default", "zeros_like.default", "ones_like.default")


def _elementwise(node: torch.fx.Node) -> bool:
    """An op whose output element reads its inputs' at the same place (or none): pointwise ops,
    casts, views, `full_like`; never a random one."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    name = f"{node.target._opname}.{node.target._overloadname}"
    return torch.Tag.pointwise in tags or node.target.is_view or name in ELEMENTWISE


def _after_tangents(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes a tangent reaches: the backward's."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "output":  # (it returns the forward's values too)
            continue
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
            a in found for a in node.all_input_nodes
        ):
            found.add(node)
    return found


def _read_by_backward(graph: torch.fx.Graph, backward: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The forward nodes whose values a backward node reads, directly or through forward nodes."""
    found: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node in backward or node.op == "output":
            continue  # (what the graph returns is no backward read)
        if any(user in backward or user in found for user in node.users):
            found.add(node)
    return found


def _expanding(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target.namespace != "aten" or f"{node.target._opname}.{node.target._overloadname}" not in PRODUCTS:
        return False
    out, a, b = node.meta.get("val"), *(getattr(x, "meta", {}).get("val") for x in node.args[:2])
    if not all(isinstance(t, torch.Tensor) for t in (out, a, b)):
        return False
    sizes = [_bytes(t) for t in (out, a, b)]
    contraction = _hint(a.shape[-1])
    if None in sizes or contraction is None:
        return False
    return contraction <= MAX_CONTRACTION and sizes[0] >= EXPANSION * (sizes[1] + sizes[2])


def _bytes(t: torch.Tensor) -> int | None:
    count = _count(t.shape)
    return None if count is None else count * t.element_size()


def _numel(node: torch.fx.Node) -> int | None:
    value = node.meta.get("val")
    return _count(value.shape) if isinstance(value, torch.Tensor) else None


def _count(shape) -> int | None:
    total = 1
    for size in shape:
        size = _hint(size)
        if size is None:
            return None
        total *= size
    return total


def _hint(size) -> int | None:
    """A size as a number: a symbolic one by the value it was traced at (None if it has none)."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None
