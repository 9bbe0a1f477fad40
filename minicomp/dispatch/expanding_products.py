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
it element by element (the softmax's shift, exponent and quotient, a mask applied to them; not
through a `full_like` of it, which reads its shape alone: a dropout mask drawn from
`full_like(scores, p)` stays what it was, and the product is no more read by the backward for it):
left free, the cut saves one of those in the scores' place. What it saves instead is what they
read besides (the softmax's row maxima and sums, a few values a row).
The rule:
- an mm or bmm of the forward (no tangent reaches it) whose value the backward reads, itself or
  through forward ops; neither it nor a value after it is tagged where the graph returns it, or
  a view of it (the caller holds it: saved, it costs nothing);
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
    returned = _returned(graph)  # (the caller holds these anyway: saving one costs nothing)
    tagged = []
    for node in graph.nodes:
        if node in backward or node not in read_later or not _expanding(node):
            continue
        for value in (node, *_elementwise_after(node, backward)):
            if value in read_later and value not in returned and value.meta.get("recompute") is None:
                value.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE  # (a user's own policy stays)
                tagged.append(value.name)
    return tagged


def _returned(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The values the graph returns and those whose memory they view (a [B * S, V] product returned
    as [B, S, V])."""
    found: set[torch.fx.Node] = set()
    stack = list(graph.output_node().all_input_nodes)
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        if node.op == "call_function" and _is_view(node):
            stack.extend(node.all_input_nodes[:1])  # (a view's base is its first argument)
    return found


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
        if not _is_view(node):
            found.append(node)
        stack.extend(node.users)
    return found


SHAPE_ONLY = ("full_like.default", "zeros_like.default", "ones_like.default")  # (read a shape, no value)


def _op_name(node: torch.fx.Node) -> str:
    return f"{node.target._opname}.{node.target._overloadname}"


def _elementwise(node: torch.fx.Node) -> bool:
    """An op whose output element reads its inputs' at the same place: pointwise ops, casts, views;
    never a random one, nor a `full_like` (it reads no value of its argument)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    return torch.Tag.pointwise in tags or _is_view(node) or _op_name(node) == "_to_copy.default"


def _is_view(node: torch.fx.Node) -> bool:
    """A view op, `_unsafe_view` (a matmul's reshape of its result) among them."""
    return isinstance(node.target, torch._ops.OpOverload) and (
        node.target.is_view or _op_name(node) == "_unsafe_view.default"
    )


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
        if any((user in backward or user in found) and not _shape_only(user) for user in node.users):
            found.add(node)
    return found


def _shape_only(node: torch.fx.Node) -> bool:
    """A `full_like` and its kind: it reads its argument's shape, not its values."""
    return isinstance(node.target, torch._ops.OpOverload) and _op_name(node) in SHAPE_ONLY


def _expanding(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target.namespace != "aten" or _op_name(node) not in PRODUCTS:
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
