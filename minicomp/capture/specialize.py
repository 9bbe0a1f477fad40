"""Graphs with dynamic shapes, compiled once per concrete shape.

Dynamo marks a dimension dynamic when a compiled function is called with a second
size of it (automatic dynamic shapes, or `torch.compile(dynamic=True)`): the graphs
AOTAutograd then hands the backend have symbolic sizes (`s0`), integer inputs for
them, and a forward that returns sizes for its backward. minicomp's kernels are
written for static shapes.

`Specializing` compiles it per call signature instead, as `minicomp.jit` compiles
a function: the first call with new sizes (each tensor's shape, strides, dtype
and device; each integer's value) traces the graph again on those concrete values
(make_fx on fake tensors: the symbols become numbers, the integer inputs constants)
and compiles that static graph; later calls with the same sizes go straight to it.
The kernels of all sizes belong to one set of kernel families
(codegen/families.py), so a new size reuses the text, and the Triton binary, of
kernels whose sizes are runtime arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.fx

from minicomp import config

Signature = tuple


def is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """Does an input of `gm` have a symbolic size, stride or value?"""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor):
            numbers = (*value.shape, *value.stride(), value.storage_offset())
            if any(isinstance(n, torch.SymInt) for n in numbers):
                return True
    return False


def concrete(gm: torch.fx.GraphModule, args: list) -> tuple[torch.fx.GraphModule, list[int]]:
    """`gm` traced again on these call values: (a graph whose inputs are the tensor arguments
    only, with every size a number, and the positions of those arguments in `args`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    values = list(args)

    def run(*tensors):
        full = list(values)
        for i, t in zip(positions, tensors):
            full[i] = t
        return torch.fx.Interpreter(gm).run(*full)

    with torch.no_grad():  # an AOTAutograd graph is already its forward or its backward
        static = make_fx(run, tracing_mode="fake", _allow_non_fake_inputs=True)(*[args[i] for i in positions])
    return static, positions


class Specializing:
    """A boxed callable (AOTAutograd's convention: it takes the argument list and empties it)
    that runs `gm` through one compiled static graph per call signature.

    `compile_static(static_gm, input_names)` compiles one; `input_names` are `gm`'s own names of
    the tensor inputs, so what the caller knows by name (a backward's saved activations) keeps
    its name. A signature that fails to compile runs `gm` as captured (`fail(err)` decides: the
    fallback policy)."""

    def __init__(self, gm: torch.fx.GraphModule, compile_static: Callable, fail: Callable[[Exception], None]):
        self.gm = gm
        self.compile_static = compile_static
        self.fail = fail
        self.names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.entries: dict[Signature, Callable] = {}
        self.limit = config.cache_limit()  # sizes kept, as minicomp.jit keeps signatures (oldest dropped)
        self._lock = threading.Lock()  # a GPU backward runs on autograd's thread
        self._boxed_call = True  # AOTAutograd's mark (on the instance: functools.wraps copies __dict__)

    def __call__(self, args: list):
        values = list(args)
        args.clear()
        key = tuple(_signature(v) for v in values)
        entry = self.entries.get(key)
        if entry is None:
            with self._lock:
                entry = self.entries.get(key) or self._build(values)
                if key not in self.entries and len(self.entries) >= self.limit:
                    self.entries.pop(next(iter(self.entries)))
                self.entries[key] = entry
        return entry(values)

    def _build(self, values: list) -> Callable:
        try:
            static, positions = concrete(self.gm, values)
            boxed = self.compile_static(static, [self.names[i] for i in positions])
        except Exception as err:  # noqa: BLE001 - this size runs as captured, by the fallback policy
            self.fail(err)
            return lambda values: self.gm(*values)

        def run(values: list):
            tensors = [values[i] for i in positions]
            values.clear()  # the compiled module frees each input at its last use
            return boxed(tensors)

        return run


def _signature(value) -> tuple:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
    return (type(value), value)
