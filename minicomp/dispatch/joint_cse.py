"""AOTAutograd's joint graph with repeated ops merged, before the min-cut partition.

The partition merges them itself (functorch's `fx_graph_cse`, config `cse`), but that pass
imports torch._inductor's pattern matcher for two helpers, and with it Inductor's lowerings and
kernel templates: a second or more of a process's first training compile that minicomp, which
never runs Inductor, would pay only for that (GPT-2's first step on the CPU: 8.95 -> 7.17 s with
the pass skipped). `merged` is the same pass without that import: an op is replaced by an earlier
one of the same target and arguments (after substitution) in the same mutation region (no op
with a mutable schema between them); placeholders, outputs, random ops, `empty`, ops whose
values share storage with a graph output, and ops defining unbacked symbols are kept. The
partition then runs with its own pass off (partition.py).
"""

from __future__ import annotations

import re

import sympy
import torch
import torch.fx as fx
from torch._functorch.compile_utils import get_aten_target, rand_ops
from torch._higher_order_ops.auto_functionalize import AutoFunctionalized
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

# what makes a call_function or call_method a mutation by its name (an in-place method's `_`)
_MUTATION_NAME = re.compile(r"(?<!_)(_$|_[.]|(\b|_)(set|enter|exit|seed)(\b|_))(?!_)")


def merged(graph: fx.Graph) -> fx.Graph:
    """A new graph computing what `graph` does, each repeated op computed once."""
    region = _mutation_regions(graph)
    kept = _aliasing_outputs(graph)
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    seen: dict[tuple, tuple[fx.Node, tuple, int]] = {}  # hash -> (new node, token, its region)
    for n in graph.nodes:
        if n.op != "call_function" or _never_merged(n, kept):
            env[n] = new.node_copy(n, lambda x: env[x])
            continue
        args, args_spec = _substituted(n.args, env)
        kwargs, kwargs_spec = _substituted(n.kwargs, env)
        token = (args, args_spec, kwargs, kwargs_spec)
        key = (n.target, hash((tuple((a, type(a)) for a in args), tuple((a, type(a)) for a in kwargs))))
        earlier = seen.get(key)
        if earlier is not None and earlier[1] == token and earlier[2] == region[n]:
            env[n] = earlier[0]
            continue
        env[n] = new.node_copy(n, lambda x: env[x])
        if earlier is None or earlier[1] == token:  # a same op in a later region: later ones take it
            seen[key] = (env[n], token, region[n])
    return new


def _never_merged(n: fx.Node, kept: set[fx.Node]) -> bool:
    target = get_aten_target(n)
    value = n.meta.get("val")
    return (
        target in rand_ops
        or target is torch.ops.aten.empty
        or n in kept
        or (isinstance(value, sympy.Symbol) and bool(free_unbacked_symbols(value)))
    )


def _substituted(values, env: dict) -> tuple[tuple, object]:
    flat, spec = tree_flatten(values)
    for i, v in enumerate(flat):
        if isinstance(v, fx.Node) and v in env:
            flat[i] = env[v]
        if isinstance(v, (torch.SymBool, torch.SymInt, torch.SymFloat)):
            flat[i] = v.node
    return tuple(flat), spec


def _mutation_regions(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's region: how many mutating ops come before it or are it."""
    regions, count = {}, 0
    for n in graph.nodes:
        count += _mutates(n)
        regions[n] = count
    return regions


def _mutates(n: fx.Node) -> bool:
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target._schema.is_mutable and not _resize_storage(n.target)
    if isinstance(n.target, AutoFunctionalized):
        return False
    if n.op == "call_function":
        return bool(_MUTATION_NAME.search(n.target.__name__))
    if n.op == "call_method":
        return bool(_MUTATION_NAME.search(n.target))
    return False


def _resize_storage(op) -> bool:
    """inductor.resize_storage_bytes_, whose schema does not mark what it mutates."""
    return op.namespace == "inductor" and op.__name__.startswith("resize_storage_bytes_")


def _aliasing_outputs(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose value shares storage with an output: merging two would make separate outputs one."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    storages = {StorageWeakRef(n.meta["val"].untyped_storage()) for n in output.all_input_nodes if _has_storage(n)}
    return {n for n in graph.nodes if _has_storage(n) and StorageWeakRef(n.meta["val"].untyped_storage()) in storages}


def _has_storage(n: fx.Node) -> bool:
    value = n.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    try:
        value.untyped_storage()
    except NotImplementedError:
        return False
    return True
