"""The graph after a chunked region, when it is a linear function of the region's results ending in
a scalar (issue #41).

A cross-entropy's mean over rows, a sum, a z-loss added with its weight, the count of rows not
ignored dividing it: what reads a region's row results `r` up to the loss `L` the graph returns
is, in all these forms, linear in `r` (an affine map `L = <u, r> + c`, `u` computed from values
that do not depend on `r`). Then L's gradient with respect to `r` is `G * u`, with `G` the
gradient the caller gives L (1 for `loss.backward()`), and `u` can be known before `r` is: it is
the tail's gradient at any point, zeros included. The region's chunks can then backpropagate
`u` while each chunk's product is still there (`chunked_rows.forward_with_gradients`) instead of
computing every chunk's product again in the backward: the forward pays the gradients' two
matmuls, the backward only scales them by `G`.

`find` returns the tail, or why there is none; the rules are per op, nothing is named for one
loss formula. A value derived from `r` is linear in it when its op is one of

- a view, a copy, a dtype cast between floating types, a sum, a mean, a negation;
- an add or a sub (any operands), a concatenation;
- a mul with one operand derived from `r`; a div whose numerator alone is;
- a select by a condition, mask or index not derived from `r` (where, masked_fill, gather,
  index_select, index).
"""

from __future__ import annotations

import torch
import torch.fx

ANY = {
    "view",
    "_unsafe_view",
    "reshape",
    "expand",
    "permute",
    "squeeze",
    "unsqueeze",
    "slice",
    "select",
    "alias",
    "clone",
    "detach",
    "_to_copy",
    "t",
    "transpose",
    "sum",
    "mean",
    "neg",
    "add",
    "sub",
    "cat",
    "stack",
}  # linear in every operand derived from r
FIRST = {"div", "gather", "index_select", "index", "masked_fill"}  # linear in their first operand only


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _linear(node: torch.fx.Node, derived: set[torch.fx.Node]) -> bool:
    """Whether `node` (which reads some value in `derived`) is linear in the values of `derived`."""
    from minicomp.dispatch.row_regions import copy_like

    val = _val(node)
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return False
    if node.target is copy_like:  # (self gives the shape and dtype, src the values)
        return node.args[0] not in derived
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return False
    name, reads = target._opname, [a for a in node.all_input_nodes if a in derived]
    if name in ANY:
        return True
    if name == "mul":  # (x * x reads x twice: not linear)
        return sum(isinstance(a, torch.fx.Node) and a in derived for a in node.args) == 1
    if name in FIRST:
        if name == "div" and node.kwargs.get("rounding_mode") is not None:
            return False
        return reads == [node.args[0]] and node.args[0] not in node.args[1:]
    if name == "where":
        return node.args[0] not in derived
    return False


class Tail:
    """The nodes after a region up to the loss: `nodes` in graph order, `inputs` the values they read
    that the region did not make, `loss` the graph output they end in."""

    def __init__(self, nodes: list[torch.fx.Node], inputs: list[torch.fx.Node], loss: torch.fx.Node):
        self.nodes, self.inputs, self.loss = nodes, inputs, loss

    def module(self, owner: torch.fx.GraphModule, results: list[torch.fx.Node]) -> torch.fx.GraphModule:
        """The tail as a graph of (*results, *inputs) -> loss, its nodes' fake values dropped."""
        graph = torch.fx.Graph()
        env = {n: graph.placeholder(f"result_{i}") for i, n in enumerate(results)}
        env.update((n, graph.placeholder(n.name)) for n in self.inputs)
        for node in self.nodes:
            env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output(env[self.loss])
        for node in graph.nodes:
            node.meta = {}
        return torch.fx.GraphModule(owner, graph)


def find(gm: torch.fx.GraphModule, results: list[torch.fx.Node]) -> Tail | str:
    """The tail after a region's `results` in `gm` (see the module's doc), or why there is none."""
    if any(not (isinstance(_val(r), torch.Tensor) and _val(r).is_floating_point()) for r in results):
        return "a result is not floating"
    derived, nodes = set(results), []
    output = next(iter(gm.graph.find_nodes(op="output")))
    for node in gm.graph.nodes:
        if node in derived or node.op != "call_function" or not any(a in derived for a in node.all_input_nodes):
            continue
        if not _linear(node, derived):
            return f"{node.name} ({getattr(node.target, '__name__', node.target)}) is not linear in the results"
        derived.add(node)
        nodes.append(node)
    returned = _flat(output.args[0])
    losses = [n for n in returned if n in derived]
    if len(losses) != 1 or losses[0] in results:
        return "the results do not end in one returned value"
    loss = losses[0]
    if _val(loss).numel() != 1:
        return f"{loss.name} is not a scalar"
    wanted = {loss}
    for node in reversed(nodes):
        if node in wanted:
            wanted.update(node.all_input_nodes)
    kept = [n for n in nodes if n in wanted]
    inputs: list[torch.fx.Node] = []
    for node in kept:
        for a in node.all_input_nodes:
            if a not in derived and a not in inputs:
                if not isinstance(_val(a), torch.Tensor):
                    return f"{a.name} is not a tensor"
                inputs.append(a)
    return Tail(kept, inputs, loss)


def _flat(value) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    return [value]


def gradient_at_zeros(tail: torch.fx.GraphModule, results: list, tail_inputs: list, device, compiled: bool):
    """The tail's gradient with respect to each result (`results`: (shape, dtype) each), as a
    function of the tail inputs (tensors on `device`): autograd through the tail at zero results,
    traced once into its ATen ops (make_fx) and compiled by minicomp.jit where `compiled`, so a
    call runs those ops, or one fused kernel, and not autograd's engine (0.6 ms of a GPT-2 step's
    host time). A result the loss does not read gets zeros."""
    import concurrent.futures

    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import capture

    def gradients(*inputs):
        zeros = [torch.zeros(shape, dtype=dtype, device=device, requires_grad=True) for shape, dtype in results]
        with torch.enable_grad():
            found = torch.autograd.grad(tail(*zeros, *inputs), zeros, allow_unused=True)
        return [torch.zeros_like(z) if g is None else g.detach() for z, g in zip(zeros, found)]

    def trace():
        return make_fx(gradients, tracing_mode="fake", decomposition_table=capture.decompositions())(*tail_inputs)

    # (a custom op's kernel runs with dispatcher state make_fx cannot nest in: a new thread starts clean)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        traced = pool.submit(trace).result()
    if not compiled or not tail_inputs:  # (no input: a few ops making constants)
        return traced
    from minicomp.dispatch.jit import jit

    return jit(traced.forward)
