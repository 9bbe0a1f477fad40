"""The IR: a networkx DiGraph of typed nodes, built from an ATen-level FX graph.
(The DiGraph is made on first use: the plan and codegen ask only for each node's users,
kept as lists, so a compile that needs no graph algorithm does not import networkx.)

Each node is one ATen op (or a graph input) with the metadata of its result:
shape, stride, dtype, device. Edges run from producer to consumer. Later stages
never change it: how each op lowers is the fusion plan's business
(`Plan.kinds`), and `graph.describe(plan.kinds)` prints the two together.

    >>> print(graph.describe(plan.kinds))
    x: float32[8, 64] stride (64, 1) cpu = input
    add: float32[8, 64] stride (64, 1) cpu = aten.add.Tensor(x, b)  # pointwise
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from minicomp.ir import dtypes


class SymbolicSize(RuntimeError):
    """A traced value whose size is a symbol, where the IR's sizes are integers: `data_dependent`
    when the symbol is unbacked (an op's output shape depends on tensor values)."""

    def __init__(self, message: str, data_dependent: bool):
        super().__init__(message)
        self.data_dependent = data_dependent

    @staticmethod
    def of(t: torch.Tensor, shape: tuple) -> SymbolicSize:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        if free_unbacked_symbols(t):
            return SymbolicSize(
                "an op's output shape depends on tensor values (nonzero, unique, masked indexing), which "
                "minicomp compiles only for static shapes. Keep that op outside the jitted function",
                data_dependent=True,
            )
        return SymbolicSize(f"a value of symbolic size {list(shape)} reached the IR, whose sizes are integers", False)


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        shape, stride = tuple(t.shape), tuple(t.stride())
        if not all(type(n) is int for n in (*shape, *stride)):
            raise SymbolicSize.of(t, shape)
        return TensorMeta(shape, stride, t.dtype, t.device)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{dtypes.short_name(self.dtype)}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Ref:
    """An argument that is the value of another node."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass
class Node:
    name: str
    target: Any  # an OpOverload, operator.getitem, or "input"
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    meta: TensorMeta | tuple | None = None

    @property
    def is_input(self) -> bool:
        return self.target == "input"

    @property
    def op_name(self) -> str:
        """'add' for aten.add.Tensor: what kernel names and headers show."""
        if self.target == "input":
            return "input"
        return getattr(self.target, "_opname", None) or getattr(self.target, "__name__", str(self.target))

    def inputs(self) -> list[str]:
        """Names of the nodes this one reads, in argument order (a new list; worked out once per
        `args` and `kwargs` object: the plan asks for a node's inputs many times)."""
        known = self.__dict__.get("_inputs")
        if known is None or known[0] is not self.args or known[1] is not self.kwargs:
            found: list[str] = []
            _collect_refs(self.args, found)
            if self.kwargs:
                _collect_refs(self.kwargs, found)
            known = self.__dict__["_inputs"] = (self.args, self.kwargs, tuple(found))
        return list(known[2])

    def describe(self, kind: object | None = None) -> str:
        """One line: name, type, the op and its arguments (and how it lowers, when `kind` is given:
        a plan's `NodeKind`, printed as its word)."""
        meta = self.meta
        if isinstance(meta, TensorMeta):
            head = f"{self.name}: {meta} stride {meta.stride} {meta.device}"
        else:
            head = f"{self.name}: {meta}"
        if self.target == "input":
            return f"{head} = input"
        args = ", ".join([repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()])
        return f"{head} = {_target_text(self.target)}({args})" + (f"  # {kind}" if kind else "")

    def __str__(self) -> str:
        return self.describe()


def _collect_refs(value, found: list[str]) -> None:
    if isinstance(value, Ref):
        if value.name not in found:
            found.append(value.name)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, (Ref, list, tuple, dict)):  # (most arguments are numbers)
                _collect_refs(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_refs(v, found)


def _target_text(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._opname}.{target._overloadname}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


class Graph:
    """Nodes in a topological order, their edges in a networkx DiGraph.

    outputs: one entry per output of the FX graph, a node name or a constant.
    mutations: (input name, node name) pairs: after the call the input holds
    the node's value (from `x.mul_(2)` in the user's function).
    constants: tensors the trace captured (inputs of the graph that the caller
    does not pass: the generated `call` takes them as keyword arguments).
    partials: reductions that compute the K partial results of a split-K reduction
    (split_reductions.py): node -> (the reduction it was split from, K).
    grouped: those of them whose partials are the row groups of a row kernel over their
    source (split_reductions.py): node -> how many leading dims of its source are rows.
    """

    def __init__(
        self,
        nodes: list[Node],
        outputs: list,
        mutations: list[tuple[str, str]],
        constants: dict[str, torch.Tensor] | None = None,
        partials: dict[str, tuple[str, int]] | None = None,
        grouped: dict[str, int] | None = None,
    ):
        self.nodes = {n.name: n for n in nodes}
        self.constants = constants or {}
        self.partials = partials or {}
        self.grouped = grouped or {}
        self.order = [n.name for n in nodes]
        self.outputs = outputs
        self.mutations = mutations
        self._users: dict[str, dict[str, None]] = {n.name: {} for n in nodes}  # ordered sets
        for n in nodes:
            for src in n.inputs():
                self._users.setdefault(src, {})[n.name] = None
        self._dag = None
        self._position: dict[str, int] | None = None

    @property
    def position(self) -> dict[str, int]:
        """Each node's index in `order` (made on first use)."""
        if self._position is None:
            self._position = {name: i for i, name in enumerate(self.order)}
        return self._position

    @property
    def dag(self):
        """The edges as a networkx DiGraph, producer -> consumer (made on first use)."""
        if self._dag is None:
            import networkx as nx

            dag = nx.DiGraph()
            for name, users in self._users.items():
                dag.add_node(name)
                dag.add_edges_from((name, user) for user in users)
            self._dag = dag
        return self._dag

    def grouped_source(self, name: str) -> str:
        """The value whose row groups partial `name` (in `grouped`) sums: its chunks view's input."""
        chunks = self.nodes[self.nodes[name].args[0].name]
        return chunks.args[0].name

    @property
    def inputs(self) -> list[str]:
        """The inputs a caller passes, in order (constants excluded)."""
        return [name for name in self.order if self.nodes[name].is_input and name not in self.constants]

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def users(self, name: str) -> list[str]:
        return list(self._users[name])

    def describe(self, kinds: dict[str, object] | None = None) -> str:
        """The graph, a node a line; with `kinds` (a plan's), each op says how it lowers."""
        lines = [self.nodes[name].describe((kinds or {}).get(name)) for name in self.order]
        lines.append(f"return {self.outputs}")
        lines += [f"mutate {dst} <- {src}" for dst, src in self.mutations]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _meta_of(value) -> TensorMeta | tuple | None:
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value)
    if isinstance(value, (tuple, list)):
        return tuple(_meta_of(v) for v in value)
    return None


def _convert(value, rename: dict[str, str]):
    """FX argument -> IR argument: fx.Node becomes Ref, containers recurse."""
    if isinstance(value, torch.fx.Node):
        return Ref(rename.get(value.name, value.name))
    if isinstance(value, (list, tuple)):
        return type(value)(_convert(v, rename) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, rename) for k, v in value.items()}
    return value


RESERVED = set(keyword.kwlist) | {
    "torch", "triton", "tl", "libdevice", "call", "call_boxed", "args", "Launch",
    "offsets", "mask", "pid", "n_elements", "BLOCK_SIZE",
    "xindex", "xmask", "xstart", "xoffset", "rindex", "rmask", "roffset", "RBLOCK", "XBLOCK",
}  # fmt: skip
# names generated code defines: index variables x0, r1; pointers a_ptr (and a value `out` would
# point through `out_ptr`, a kernel's output); kernels, launches; the combine helpers of
# templates/combine.py.j2; the runtime's Launch and launch specs
_GENERATED = re.compile(
    r"[xr]\d+|out\d*|.*_ptr|mc_.*|launch_\d+|_(sum|prod|max|min|argmax|argmin|exp_shift|logaddexp)(_nan)?|\w*Launch"
)


def is_reserved(name: str) -> bool:
    """Whether a value may not be named `name` in generated code (it would shadow a name the
    kernel or the wrapper defines: a user's argument `x0` is also the index of dim 0)."""
    return name in RESERVED or _GENERATED.fullmatch(name) is not None


def fx_names(gm: torch.fx.GraphModule, input_names: list[str] | None = None) -> dict[str, str]:
    """{fx node name: the IR's name for it} where `from_fx` renames it (the rest keep theirs)."""
    return _names(gm, input_names)


def _names(gm: torch.fx.GraphModule, wanted: list[str] | None) -> dict[str, str]:
    """Node renames: make_fx's `x_1` becomes the user's `x` where that is free, and a name that
    generated code reserves (`is_reserved`) becomes a free one (`x0` -> `x0_v`)."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    taken = {n.name for n in gm.graph.nodes} | RESERVED
    rename = {}
    for fx_name, want in zip(placeholders, wanted or []):
        want = re.sub(r"[^A-Za-z0-9_]", "_", want)  # generated identifiers stay ASCII
        if want and is_reserved(want):
            want = f"{want.strip('_') or 'v'}_v"
        if want and want.isidentifier() and want not in taken and not is_reserved(want):
            rename[fx_name] = want
            taken.add(want)
    for node in gm.graph.nodes:
        if node.op != "output" and node.name not in rename and is_reserved(node.name):
            free = f"{node.name.strip('_') or 'v'}_v"
            while free in taken or is_reserved(free):
                free += "_"
            rename[node.name] = free
            taken.add(free)
    return rename


def from_fx(gm: torch.fx.GraphModule, input_names: list[str] | None = None) -> Graph:
    """Build the IR from an ATen-level FX graph whose nodes carry meta['val'].

    input_names: names for the graph inputs, in order (the user's argument names).
    """
    rename = _names(gm, input_names)
    nodes: list[Node] = []
    outputs: list = []
    mutations: list[tuple[str, str]] = []
    constants: dict[str, torch.Tensor] = {}
    read_after = set(gm.graph.nodes)  # the nodes not yet passed
    for fx_node in gm.graph.nodes:
        read_after.discard(fx_node)
        if fx_node.op == "placeholder":
            name = rename.get(fx_node.name, fx_node.name)
            nodes.append(Node(name, "input", meta=_meta_of(fx_node.meta.get("val"))))
        elif fx_node.op == "output":
            result = fx_node.args[0]
            flat = list(result) if isinstance(result, (list, tuple)) else [result]
            outputs = [_convert(v, rename).name if isinstance(v, torch.fx.Node) else v for v in flat]
        elif fx_node.op == "call_function":
            if fx_node.target is torch.ops.aten.copy_.default and fx_node.args[0].op == "placeholder":
                mutations.append((_convert(fx_node.args[0], rename).name, _convert(fx_node.args[1], rename).name))
                # its result is the new value (a decomposition's running mean read on, `W += x; return W`);
                # the input itself is written at the end, so nothing may read it after the write
                rename[fx_node.name] = mutations[-1][1]
                if any(u is not fx_node and u.op != "output" and u in read_after for u in fx_node.args[0].users):
                    raise NotImplementedError(f"{fx_node.name}: an input read after a write into it")
                continue
            node = Node(
                rename.get(fx_node.name, fx_node.name),
                fx_node.target,
                _convert(fx_node.args, rename),
                _convert(dict(fx_node.kwargs), rename),
                _meta_of(fx_node.meta.get("val")),
            )
            nodes.append(node)
        elif fx_node.op == "get_attr":  # a tensor constant of the trace (torch.tensor([...]) in the function)
            value = getattr(gm, fx_node.target)
            name = rename.get(fx_node.name, fx_node.name)
            constants[name] = value
            nodes.append(Node(name, "input", meta=_meta_of(value)))
        else:
            raise NotImplementedError(f"FX node kind {fx_node.op!r} ({fx_node.name}) in an ATen graph")
    return Graph(nodes, outputs, mutations, constants)
