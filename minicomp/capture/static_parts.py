"""A graph with dynamic sizes whose work is nearly all static: its static parts compiled once.

Text generation with a growing KV cache makes Dynamo's graph dynamic in the cache's length
from the third token on: per layer, the cache's `cat` [B, H, s0 + 1, D] and the attention over
it have symbolic shapes, while the norms, projections, RoPE and MLP all work on the new token,
[B, 1, d], the same at every length. Compiling that graph per concrete length (specialize.py)
costs a compile per token. Here the graph is cut instead:

- A node is **static** when its value has fixed sizes and strides, and every tensor it reads
  does too (a value of an earlier node, wherever computed); a size it reads is a node whose
  value is no tensor, so such a node is not static.
  Every other node (a `cat` onto the cache, the attention, `sym_size`, arithmetic on sizes)
  is **dynamic**: it runs as the ATen op it is, which takes any size.
- A static node's **level** is the number of dynamic nodes on its longest path from the
  inputs that are followed by a static one; a dynamic node has the level of its inputs. The
  static nodes of one level are one static graph (a path between two of them through a dynamic
  node would raise the second's level), compiled once, at its first call, for every length.
- The graph then runs as level 0's static part, level 0's dynamic nodes, level 1's static part,
  ... (`StaticParts`): a dynamic node reads static parts of its level or below, a static part
  dynamic nodes of lower levels.

Only a graph whose compute ops (views aside) are at least config's `static_share` static is cut
(`worth_cutting`): the dynamic ops run unfused, so a prefill or a training step at a new sequence
length, where nearly every op has the length in its shape, is compiled per size as before. Levels
order nodes by what they read, not by when they write, so a graph with an op that writes (an
input's `copy_`, kept in inference graphs) is not cut either. A part's input that an ATen op makes
at run time is checked against the layout the trace predicted: where it differs, that call runs
the part as captured.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable

import torch
import torch.fx

from minicomp import config, logs
from minicomp.lowering.ops import VIEWS


def _fixed(val) -> bool:
    """A tensor value with sizes, strides and offset all plain integers."""
    return isinstance(val, torch.Tensor) and all(
        isinstance(n, int) for n in (*val.shape, *val.stride(), val.storage_offset())
    )


def _layout(t: torch.Tensor) -> tuple:
    """Sizes, strides and offset; the stride of a size-1 dimension addresses nothing, so it is left
    out (SDPA's output on the CPU: (96, 8, 96, 1) where the trace said (32, 8, 8, 1) for [1, 4, 1, 8])."""
    return tuple(t.shape), tuple(s if n != 1 else 0 for n, s in zip(t.shape, t.stride())), t.storage_offset()


def static_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes of `gm` that compute with fixed sizes only (the module docstring's rule)."""
    static: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":  # (a size it reads is a node whose value is no tensor: dynamic)
            continue
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):  # several results: each read by a getitem of its part
            fixed = bool(val) and all(map(_fixed, val)) and all(u.target is operator.getitem for u in node.users)
        else:
            fixed = _fixed(val)
        if fixed and all(a in static or _fixed(a.meta.get("val")) for a in node.all_input_nodes):
            static.add(node)
    return static


def levels(gm: torch.fx.GraphModule, static: set[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """Each node's level (the module docstring's): one more past a dynamic node a static one reads."""
    level: dict[torch.fx.Node, int] = {}
    for node in gm.graph.nodes:
        level[node] = max(
            (level[a] + (a.op == "call_function" and a not in static and node in static) for a in node.all_input_nodes),
            default=0,
        )
    return level


def _is_compute(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target._opname not in VIEWS


def worth_cutting(gm: torch.fx.GraphModule, static: set[torch.fx.Node]) -> bool:
    """Enough of the compute static, and no op that writes: levels order the nodes by what they
    read, so a write into an input (AOTAutograd's `copy_` at the graph's end) could run before a
    read of the old value."""
    if any(_writes(n) for n in gm.graph.nodes if n.op == "call_function"):
        return False
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and _is_compute(n)]
    fixed = sum(1 for n in compute if n in static)
    return bool(compute) and fixed >= config.get("static_share") * len(compute)


def _writes(node: torch.fx.Node) -> bool:
    """Whether `node` may write: an ATen op whose schema says so, or any call but Python's
    arithmetic and getitem on sizes and tuples (a higher-order op: unknown, so refused)."""
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    return getattr(node.target, "__module__", None) not in ("_operator", "math") and not (
        getattr(node.target, "__name__", "").startswith("sym_") and node.target.__module__ == "torch"
    )


class _Part(torch.nn.Module):
    """One level's static graph: compiled by `compile_static(graph, input_names, name)` at its first
    call, run as captured where that fails (`fail(err)` applies the fallback policy)."""

    def __init__(self, graph: torch.fx.GraphModule, inputs: list[torch.fx.Node], name: str, compile_static, fail):
        super().__init__()
        self.graph_module, self.input_names, self.part_name = graph, [a.name for a in inputs], name
        self.compile_static, self.fail = compile_static, fail
        self.compiled: Callable | None = None
        self._lock = threading.Lock()  # one compile when several threads call it first
        # what the compiled part assumes of the values an ATen op makes at run time (Dynamo
        # guards the graph's own inputs): the layouts the trace predicted, exactly (a call's fast
        # check) and up to size-1 strides (`_layout`)
        made = [(i, a.meta["val"]) for i, a in enumerate(inputs) if a.op == "call_function"]
        self.layouts = [(i, _layout(v)) for i, v in made]
        self.traced = [(i, tuple(v.shape), tuple(v.stride()), v.storage_offset()) for i, v in made]

    def _laid_out_as_traced(self, tensors) -> bool:
        for i, shape, stride, offset in self.traced:
            t = tensors[i]
            if t.shape != shape or t.stride() != stride or t.storage_offset() != offset:
                return all(_layout(tensors[i]) == layout for i, layout in self.layouts)
        return True

    def forward(self, *tensors):
        if not self._laid_out_as_traced(tensors):
            logs.recompiles.info("%s: an input laid out unlike its trace; run as captured", self.part_name)
            return self.graph_module(*tensors)
        if self.compiled is None:
            with self._lock:
                if self.compiled is None:
                    self.compiled = self._compile()
        return self.compiled(list(tensors))

    __call__ = forward  # (called once a token: nn.Module's hooks and dispatch skipped)

    def _compile(self) -> Callable:
        try:
            return self.compile_static(self.graph_module, self.input_names, self.part_name)
        except Exception as err:  # noqa: BLE001 - this part runs as captured, by the fallback policy
            self.fail(err)
            return lambda values: self.graph_module(*values)


def _part_graph(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> tuple:
    """(graph of `nodes` alone, its inputs: nodes outside that they read, its outputs: nodes of
    `nodes` read outside them)."""
    members = set(nodes)
    graph, env, inputs = torch.fx.Graph(), {}, []
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in members and a not in env:
                env[a] = graph.placeholder(a.name)
                env[a].meta = dict(a.meta)
                inputs.append(a)
    for node in nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(gm, graph), inputs, outputs


def cut(gm: torch.fx.GraphModule, static: set[torch.fx.Node], compile_static, fail, name: str):
    """`gm` as one graph that calls its static parts (a `_Part` module each) between its dynamic
    nodes, level by level."""
    level = levels(gm, static)
    graph_outputs = next(reversed(gm.graph.find_nodes(op="output")))
    root, graph, env = {}, torch.fx.Graph(), {}
    body = [n for n in gm.graph.nodes if n.op == "call_function"]
    for node in gm.graph.nodes:  # the inputs and constants first: any part may read them
        if node.op in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, env.__getitem__)
    for k in range(max((level[n] for n in body), default=0) + 1):
        part = [n for n in body if n in static and level[n] == k]
        if part:
            sub, inputs, outputs = _part_graph(gm, part)
            label = f"part{k}"
            root[label] = _Part(sub, inputs, f"{name}_{label}", compile_static, fail)
            results = graph.call_module(label, tuple(env[a] for a in inputs))
            for i, node in enumerate(outputs):
                env[node] = graph.call_function(operator.getitem, (results, i))
                env[node].meta = dict(node.meta)
        for node in body:
            if node not in static and level[node] == k:
                env[node] = graph.node_copy(node, env.__getitem__)
    graph.node_copy(graph_outputs, env.__getitem__)
    for node in gm.graph.find_nodes(op="get_attr"):
        root[node.target] = functools.reduce(getattr, node.target.split("."), gm)
    return torch.fx.GraphModule(root, graph, class_name="StaticParts")


class StaticParts:
    """A boxed callable (AOTAutograd's convention) running a dynamic graph cut by `cut`: its static
    parts compiled once each, whatever the sizes; its dynamic nodes as ATen ops."""

    def __init__(self, gm: torch.fx.GraphModule, static: set[torch.fx.Node], compile_static, fail, name: str):
        self.cut = cut(gm, static, compile_static, fail, name)
        parts = sum(1 for _ in self.cut.children())
        logs.recompiles.info(
            "%s: dynamic sizes in %d of its ops; %d static parts compiled once for every size",
            name,
            sum(1 for n in gm.graph.nodes if n.op == "call_function" and n not in static),
            parts,
        )
        self._boxed_call = True

    def __call__(self, args: list):
        values = list(args)
        args.clear()
        return self.cut.forward(*values)  # (an internal module: no hooks to run)
