"""Matmul kernels in the plan: which mm, addmm and bmm run as a Triton template, and the epilogue
each computes in its store.

Fusion (fusion.py) plans every matmul as an extern ATen call (cuBLAS): a kernel boundary, its
result written, and its pointwise consumers (bias, activation, residual, scale, cast) in a
kernel of the next stage that reads it back. `templated` then takes, for each matmul the setting
chooses (`choice`), that kernel's stores that read the product at its own element and moves
them into a `MatmulKernel` (steps.py): the template computes a tile of the product in float32
and evaluates those stores at the tile's index before its store (codegen/matmul.py), through
the same lowering rules as any kernel. So the epilogue is whatever the pointwise fusion rules
put in one kernel with the product, not a list of known patterns; the product itself is
written only where something else reads it (a graph output, a backward's saved value, an ATen
call, a reduction kernel). A linear layer's forward is one kernel; its backward's mms (dx =
dy @ w, dw = dy^T @ x) are templates too, reading transposed operands at their strides.

A store is the matmul's epilogue when the kernel of the matmul's stage that writes it reads the
product only at the element being stored: every node on its paths from the product is
pointwise or a reshape, of the product's element count, and evaluating the store's index back
through them (the lowering's own index rules) gives the product's own index. A store that also
reads another templated matmul of its stage goes with the later of the two (graph order), which
reads the earlier one's product from memory (SwiGLU's silu(x @ w1) * (x @ w3)).

An operand only its matmul reads, written by a pointwise kernel of an earlier stage (`(x * s) @
w`, a weight cast, through ATen views read by nothing else) is the matmul's prologue: computed in
the template's K loop as it is loaded, never written (`_prologues`). An operand a that is all
another template writes (an MLP's hidden layer) is a *chain*: that template's product and
epilogue computed in the prologue too, its kernel gone (`_chainable`). A product only another
template's epilogue reads may be its *sibling*, a second accumulator in that kernel
(`_siblings`; config "matmul_siblings", off: measured slower).

The setting (config "matmul", MINICOMP_MATMUL): "library" (default) keeps every matmul an ATen call;
"template" makes every matmul the template can run one (the CPU tests: Triton's interpreter
runs tl.dot); "auto" keeps ATen's calls on the CPU, and on CUDA takes the template for a
matmul with an epilogue to fuse (of sizes >= 16, between config "matmul_min_macs" and
"matmul_max_macs" multiply-adds: a smaller one is not worth a compile of its tiles) where
timing it against cuBLAS + an epilogue kernel on this GPU says it is faster
(runtime/matmul_choice.py, remembered in the tuning cache: a warm process measures nothing); a
matmul without an epilogue stays with cuBLAS, unless it would end a chain (`_chain_ends`). float32 uses TF32 where
`torch.backends.cuda.matmul.allow_tf32` allows it (read when the graph compiles, as Inductor does).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from minicomp import config
from minicomp.ir import Graph, Ref, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.indexing import Expr, FloorDiv, IterationSpace, Mod
from minicomp.lowering.layout import output_strides
from minicomp.lowering.ops import NodeKind, bind
from minicomp.lowering.ops.core import broadcast_index
from minicomp.lowering.ops.views import reshape_index
from minicomp.plan.steps import Extern, Kernel, MatmulKernel, Plan, PointwiseKernel, Refusal

MATMULS = {"mm", "addmm", "bmm"}
MODES = ("auto", "template", "library")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SAME_INDEX = {"alias", "clone", "contiguous", "lift_fresh_copy"}  # views that pass the index through
RESHAPES = {"view", "reshape", "squeeze", "unsqueeze"}  # views that regroup it (reshape_index)


def mode() -> str:
    """The setting, validated."""
    value = config.get("matmul")
    if value not in MODES:
        raise config.ConfigError(f"MINICOMP_MATMUL (matmul) must be one of {', '.join(MODES)}, not {value!r}")
    return value


def operands(graph: Graph, name: str) -> tuple[str, str, str | None]:
    """(a, b, the bias addmm adds or None) of matmul `name`."""
    node = graph[name]
    args = node.args[1:3] if node.op_name == "addmm" else node.args[:2]
    bias = node.args[0].name if node.op_name == "addmm" else None
    return args[0].name, args[1].name, bias


def scales(graph: Graph, name: str) -> tuple[float, float]:
    """(alpha, beta) of an addmm (alpha * a @ b + beta * bias); (1, 0) otherwise."""
    node = graph[name]
    if node.op_name != "addmm":
        return 1, 0
    args = bind(node)
    return args.get("alpha", 1), args.get("beta", 1)


def refusal(graph: Graph, name: str) -> str | None:
    """Why the template cannot run matmul `name` (None: it can)."""
    node = graph[name]
    meta = node.meta
    refs = node.args[:3] if node.op_name == "addmm" else node.args[:2]
    if not isinstance(meta, TensorMeta) or not all(isinstance(r, Ref) for r in refs):
        return "its operands are not all tensors"
    metas = [graph[r.name].meta for r in refs]
    if not all(isinstance(m, TensorMeta) and m.dtype == meta.dtype and m.device == meta.device for m in metas):
        return "its operands differ in dtype or device"
    if meta.dtype not in DTYPES:
        return f"the template computes {', '.join(map(str, DTYPES))}, not {meta.dtype}"
    if meta.device.type not in ("cuda", "cpu"):
        return f"the template runs on CUDA and the CPU (interpreter), not {meta.device.type}"
    if 0 in meta.shape or graph[refs[-1].name].meta.shape[-2] == 0:
        return "it is empty"
    alpha, beta = scales(graph, name)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
        return "its alpha or beta is not a number"
    return None


def macs(graph: Graph, name: str) -> int:
    """Multiply-adds of matmul `name`."""
    a, b, _ = operands(graph, name)
    return math.prod(graph[name].meta.shape) * graph[a].meta.shape[-1]


def choice(graph: Graph, name: str, epilogue: bool) -> tuple[bool, str]:
    """(whether the template runs matmul `name`, why), by the setting; `epilogue`: whether it has
    pointwise consumers to fuse."""
    why = refusal(graph, name)
    if why is not None:
        return False, f"ATen: {why}"
    setting = mode()
    if setting != "auto":
        return setting == "template", f"{setting}: MINICOMP_MATMUL={setting}"
    meta = graph[name].meta
    if meta.device.type == "cpu":
        return False, "ATen: auto on the CPU"
    if not epilogue:
        return False, "ATen: auto, no epilogue to fuse"
    if macs(graph, name) > config.get("matmul_max_macs"):
        return False, f"ATen: auto, over {config.get('matmul_max_macs')} multiply-adds"
    if macs(graph, name) < config.get("matmul_min_macs"):
        return False, f"ATen: auto, under {config.get('matmul_min_macs')} multiply-adds"
    a, b, _ = operands(graph, name)
    if min(meta.shape[-2:] + (graph[a].meta.shape[-1],)) < 16:
        return False, "ATen: auto, a size under 16"
    from minicomp.runtime.matmul_choice import template_pays

    layouts = [(graph[x].meta.shape, graph[x].meta.stride) for x in (a, b)]
    return template_pays(meta.dtype, meta.device, *layouts, meta.shape)


def templated(plan: Plan, fill) -> Plan:
    """`plan` with each matmul the setting chooses as a `MatmulKernel` that computes its epilogue;
    the same plan when none is. `fill(graph, kernel, kinds, stage_of, materialized)`: fusion.py's
    walk from a kernel's stores to what it computes and reads."""
    graph = plan.graph
    externs = [s.node for s in plan.steps if isinstance(s, Extern) and graph[s.node].op_name in MATMULS]
    setting = mode()
    if not externs or setting == "library" or (setting == "auto" and _all_on_cpu(graph, externs)):
        return plan
    readers = _epilogues(plan, externs)
    chosen = {}
    for e in externs:
        ok, why = choice(graph, e, any(e in hosts for hosts in readers.values()))
        if ok:
            chosen[e] = why
    if setting == "auto":
        chosen |= _chain_ends(plan, externs, readers, chosen)
    if not chosen:
        return plan
    host = {}  # epilogue store -> the matmul whose kernel computes it
    for store, hosts in readers.items():
        mine = [e for e in hosts if e in chosen]
        if mine and mine[-1] == hosts[-1]:  # the latest matmul it reads (a later one read from memory)
            host[store] = mine[-1]
    steps, materialized = [], set(plan.materialized)
    kernels: dict[str, MatmulKernel] = {}
    for step in plan.steps:
        if isinstance(step, Extern) and step.node in chosen:
            e = step.node
            stores = [s for s in graph.order if host.get(s) == e]
            kernels[e] = MatmulKernel(0, step.stage, graph[e].meta.shape, stores, matmul=e, why=chosen[e])
            continue
        if isinstance(step, PointwiseKernel) and any(s in host for s in step.stores):
            left = [s for s in step.stores if s not in host]
            if left:
                steps.append(replace(step, stores=left))
            continue
        steps.append(step)
    if config.get("matmul_siblings"):
        _siblings(plan, steps, kernels, materialized)
    steps = _prologues(plan, steps, kernels, materialized)
    # the product is written only where something outside its kernel reads it
    for e, kernel in kernels.items():
        if not kernel.stores or _read_elsewhere(plan, steps, kernels, e):
            kernel.stores.insert(0, e)
        else:
            materialized.discard(e)
    inlined = {x for kernel in kernels.values() for k in members(kernel) for x in k.prologue}
    strides = dict(plan.strides)
    for kernel in kernels.values():
        for name in kernel.stores:
            strides.setdefault(name, output_strides(graph[name].meta))
    # each stage's matmul kernels run after its externs, before its other kernels, in graph order
    placed: list = []
    for step in steps:  # (before the first kernel of their stage, or the first step of a later one)
        placed += _due(kernels, step.stage - (not isinstance(step, Kernel)), plan, materialized)
        placed.append(step)
    placed += _due(kernels, None, plan, materialized)
    steps, index = [], 0
    for step in placed:
        if isinstance(step, Kernel):
            if not isinstance(step, MatmulKernel):
                step = fill(graph, replace(step, index=index), plan.kinds, plan.stage_of, materialized)
            else:
                step = replace(step, index=index)
            index += 1
        steps.append(step)
    names = {step.name for step in steps if isinstance(step, Kernel)}
    gone = inlined | {v for step in steps if isinstance(step, MatmulKernel) for v in _inlined_views(plan, step)}
    refusals = [
        r for r in plan.refusals if not {r.producer, r.consumer} & (set(chosen) | gone) and _current(r, names)
    ] + [
        Refusal(a, e, f"{e} is a matmul template: its operands are read from memory")
        for e in chosen
        for a in operands(graph, e)
        if a is not None and plan.kinds[a].fusible and a not in inlined
    ]
    return replace(plan, steps=steps, materialized=materialized, refusals=refusals, strides=strides)


def _chain_ends(plan: Plan, externs: list[str], readers: dict, chosen: dict[str, str]) -> dict[str, str]:
    """In "auto": the matmuls not chosen (no epilogue: an MLP's last layer) whose operand a is the
    epilogue of a chosen template, read by them alone, both widths within config
    "matmul_chain_width": taken too, untimed, so that `_prologues` chains them into one kernel
    (docs/experiments.md: such a chain took 0.62-0.68x the GPU time of a template a layer, itself
    about half of cuBLAS + epilogue's)."""
    graph, width, found = plan.graph, config.get("matmul_chain_width"), {}
    for e in externs:
        if e in chosen or graph[e].op_name not in ("mm", "addmm") or refusal(graph, e) is not None:
            continue
        base, reader = operands(graph, e)[0], e
        while graph[base].op_name in ops.VIEWS and graph.users(base) == [reader]:
            base, reader = graph[base].inputs()[0], base
        inner = (readers.get(base) or [None])[-1]
        if (
            inner in chosen
            and graph.users(base) == [reader]
            and graph[inner].op_name in ("mm", "addmm")
            and graph[inner].meta.device.type == "cuda"
            and max(graph[inner].meta.shape[-1], graph[e].meta.shape[-1]) <= width
        ):
            found[e] = f"auto: chained to {inner} (widths <= {width}: one kernel)"
    return found


def _siblings(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], materialized: set[str]) -> None:
    """Each matmul kernel that writes nothing but its product, which only the epilogue of another
    matmul kernel of the same output shape reads (at its own element), moved into that kernel's
    `siblings` (out of `kernels` and memory): the other kernel computes its tile of that product
    too, a second accumulator and K loop (SwiGLU's `silu(x @ w1) * (x @ w3)`, LoRA's
    `x @ w + s * (x @ a) @ b`). 2-D products (mm, addmm)."""
    import networkx as nx

    graph = plan.graph
    for e, kernel in list(kernels.items()):
        if e not in kernels or graph[e].op_name not in ("mm", "addmm"):
            continue
        for store in kernel.stores:
            before = nx.ancestors(graph.dag, store)
            for other in [o for o in kernels if o != e and o in before]:
                sibling = kernels[other]
                if (
                    sibling.stores
                    or sibling.stage > kernel.stage
                    or graph[other].op_name not in ("mm", "addmm")
                    or graph[other].meta.shape != graph[e].meta.shape
                    or other in graph.outputs
                    or not _at_own_element(plan, store, other, _downstream_to(graph, other, store))
                    or _read_elsewhere(plan, steps, {k: v for k, v in kernels.items() if k != e}, other)
                ):
                    continue
                kernel.siblings += (kernels.pop(other),)
                materialized.discard(other)


def _prologues(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], materialized: set[str]) -> list:
    """`steps` with each operand that only its matmul reads, written by a pointwise kernel of an
    earlier stage (a scale, a cast: `(x * s) @ w`), computed by the template as it loads it: taken
    out of that kernel's stores (the kernel dropped when nothing is left) and out of memory. The
    operand may be reached through ATen views of such a value read by nothing else (linear's
    `t(w.to(bf16))`): those views are evaluated in the kernel too, their ATen calls dropped.
    An `a` operand that is all another matmul kernel writes (`_chainable`: an MLP's hidden layer)
    is computed the same way, that kernel taken out of `kernels` into the reader's `chained`."""
    graph = plan.graph
    outputs = {o for o in graph.outputs if isinstance(o, str)} | {n for pair in graph.mutations for n in pair}
    writer = {name: step for step in steps if isinstance(step, PointwiseKernel) for name in step.stores}
    taken: set[str] = set()
    views: set[str] = set()
    absorbed: set[str] = set()  # matmuls whose kernel a later template computes in its prologue
    for e, kernel in kernels.items():
        a, b, _ = operands(graph, e)
        inline = []
        for x in dict.fromkeys((a, b)):
            chain, base, reader = [], x, e
            while plan.kinds[base] is NodeKind.EXTERN and graph[base].op_name in ops.VIEWS and base not in outputs:
                if graph.users(base) != [reader]:
                    break
                chain.append(base)
                base, reader = graph[base].inputs()[0], base
            if (
                base in writer
                and plan.kinds[base].computed
                and base not in outputs
                and graph.users(base) == [reader]
                and writer[base].stage < kernel.stage
            ):
                inline.append(x)
                taken.add(base)
                views.update(chain)
            elif x == a and (inner := _chainable(plan, kernels, kernel, base, reader, outputs)) is not None:
                inline.append(x)
                kernel.chained = (inner,)
                absorbed.add(inner.matmul)
                taken.update({base, inner.matmul})
                views.update(chain)
        kernel.prologue = tuple(inline)
    for e in absorbed:
        del kernels[e]
    materialized -= taken | views
    found = []
    for step in steps:
        if isinstance(step, Extern) and step.node in views:
            continue
        if isinstance(step, PointwiseKernel) and taken & set(step.stores):
            left = [n for n in step.stores if n not in taken]
            if left:
                found.append(replace(step, stores=left))
            continue
        found.append(step)
    return found


def _chainable(
    plan: Plan, kernels: dict[str, MatmulKernel], kernel: MatmulKernel, base: str, reader: str, outputs: set[str]
) -> MatmulKernel | None:
    """The matmul kernel `kernel`'s operand a can be computed inside (a *chain*: `relu(x @ w1 + b1) @
    w2`), or None. It is the kernel of an earlier stage that writes `base` (its epilogue's one
    store, or its product where it has none) and nothing else, read by `reader` alone. Both are
    2-D products (mm, addmm) and the hidden width fits on chip: the inner product's columns (the
    outer's K) at most config "matmul_chain_width". A program computes its row tile of the hidden
    value once where the outer's columns fit that width too (one column tile holds them all);
    wider, each column tile computes it again, taken only where that costs at most a quarter of
    the kernel's multiply-adds (LoRA's `(x @ a) @ b` beside its sibling `x @ w`). A value a
    backward saves, a graph output or a second reader keeps its kernel: it must be written."""
    graph = plan.graph
    width = config.get("matmul_chain_width")
    inner = next((k for k in kernels.values() if k is not kernel and base in (k.stores or [k.matmul])), None)
    if inner is None or inner.stores not in ([], [base]) or inner.stage >= kernel.stage:
        return None
    if base in outputs or graph.users(base) != [reader] or inner.matmul in outputs:
        return None
    if not {graph[inner.matmul].op_name, graph[kernel.matmul].op_name} <= {"mm", "addmm"}:
        return None
    if graph[inner.matmul].meta.shape[-1] > width:
        return None
    if _recomputed(graph, kernel, inner) * 4 > _macs_in(graph, kernel, inner):
        return None
    if graph[inner.matmul].meta.device != graph[kernel.matmul].meta.device:
        return None
    # every value from the inner product to `base` is read only on the way to `base`, and the
    # operand (through its views) reads the product at its own element
    between = _downstream_to(graph, inner.matmul, base)
    if any(set(graph.users(n)) - between - {reader} for n in between | {inner.matmul} if n != base):
        return None
    operand = operands(graph, kernel.matmul)[0]
    if graph[operand].meta.shape != graph[inner.matmul].meta.shape:
        return None
    if not _at_own_element(plan, operand, inner.matmul, _downstream_to(graph, inner.matmul, operand)):
        return None
    return inner


def _recomputed(graph: Graph, kernel: MatmulKernel, inner: MatmulKernel) -> int:
    """Multiply-adds a chain computes again: the inner kernel's once more for each column tile of
    the outer product past the first (none within config "matmul_chain_width" columns, one tile;
    else tiles of 128 columns)."""
    n = graph[kernel.matmul].meta.shape[-1]
    tiles = 1 if n <= config.get("matmul_chain_width") else -(-n // 128)
    return (tiles - 1) * sum(macs(graph, k.matmul) for k in members(inner))


def _macs_in(graph: Graph, kernel: MatmulKernel, inner: MatmulKernel) -> int:
    """Multiply-adds of a chained kernel: its own, its siblings' and the inner kernel's, once."""
    return sum(macs(graph, k.matmul) for k in members(kernel) + members(inner))


def _downstream_to(graph: Graph, start: str, end: str) -> set[str]:
    """The nodes on paths from `start` to `end` (with `end`, without `start`)."""
    import networkx as nx

    return (nx.descendants(graph.dag, start) & nx.ancestors(graph.dag, end)) | {end}


def _current(refusal: Refusal, names: set[str]) -> bool:
    """Whether a refusal names no kernel of the plan before `templated` changed it."""
    return all(not n.startswith("mc_") or n in names for n in (refusal.producer, refusal.consumer))


def _all_on_cpu(graph: Graph, externs: list[str]) -> bool:
    return all(graph[e].meta.device.type == "cpu" for e in externs if isinstance(graph[e].meta, TensorMeta))


def _due(kernels: dict[str, MatmulKernel], stage: int | None, plan: Plan, materialized) -> list[MatmulKernel]:
    """The matmul kernels of stages up to `stage` (all, for None) not placed yet, filled in."""
    due = [e for e, k in kernels.items() if stage is None or k.stage <= stage]
    found = []
    for e in sorted(due, key=plan.graph.order.index):
        found.append(_filled(plan, kernels.pop(e), materialized))
    return found


def _filled(plan: Plan, kernel: MatmulKernel, materialized) -> MatmulKernel:
    """`kernel` with the nodes it computes (the matmul, then its epilogue's) and what it reads
    (the matmul's operands, then what the epilogue loads)."""
    graph, e = plan.graph, kernel.matmul
    inner = {k.matmul for k in members(kernel) if k is not kernel}  # its chain's and siblings' products
    seen, stack = set(), [s for s in kernel.stores if s != e] + list(kernel.prologue)
    while stack:
        name = stack.pop()
        if name in seen or name == e:
            continue
        seen.add(name)
        if name not in inner | _inlined_views(plan, kernel) and _loadable(plan, {name}, kernel, materialized):
            continue
        stack += graph[name].inputs()
    loadable = _loadable(plan, seen - inner, kernel, materialized)
    computed = [n for n in graph.order if n in seen and n not in loadable]
    a, b, bias = operands(graph, e)
    read = [x for x in (a, b) if x not in kernel.prologue] + ([bias] if bias else [])
    loads = read + [n for n in graph.order if n in loadable]
    loads = list(dict.fromkeys(loads))
    nodes = [e] + computed
    return replace(kernel, nodes=nodes, loads=loads, op_names=[graph[n].op_name for n in nodes])


def _loadable(plan: Plan, names, kernel: Kernel, materialized) -> set[str]:
    inlined = _inlined_views(plan, kernel) if isinstance(kernel, MatmulKernel) else set()
    return {
        n
        for n in names
        if n not in inlined and (not plan.kinds[n].computed or (n in materialized and plan.stage_of[n] < kernel.stage))
    }


def folded(kernel: MatmulKernel) -> list[tuple[MatmulKernel, str]]:
    """The kernels `kernel` computes too, each with how: "chained" (where it reads an operand a)
    or "sibling" (where its epilogue reads the product)."""
    found = []
    for inner, how in [(k, "chained") for k in kernel.chained] + [(k, "sibling") for k in kernel.siblings]:
        found += [(inner, how)] + folded(inner)
    return found


def epilogue_nodes(graph: Graph, kernel: MatmulKernel) -> list[str]:
    """The nodes a matmul kernel computes from its product (not those of its prologue)."""
    import networkx as nx

    after = nx.descendants(graph.dag, kernel.matmul)
    return [n for n in kernel.nodes if n in after]


def members(kernel: MatmulKernel) -> list[MatmulKernel]:
    """`kernel` and the kernels it computes too: those of its prologue (a chain's inner layers)
    and its siblings, and theirs."""
    found = [kernel]
    for inner in kernel.chained + kernel.siblings:
        found += members(inner)
    return found


def _inlined_views(plan: Plan, kernel: MatmulKernel) -> set[str]:
    """The ATen views between a prologue operand and the value it is computed from (`_prologues`),
    in the kernel and in the kernels of its chain."""
    found = set()
    for x in (x for k in members(kernel) for x in k.prologue):
        while plan.kinds[x] is NodeKind.EXTERN and plan.graph[x].op_name in ops.VIEWS:
            found.add(x)
            x = plan.graph[x].inputs()[0]
    return found


def _read_elsewhere(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], e: str) -> bool:
    """Whether something other than matmul `e`'s own kernel reads its product: a graph output, a
    mutation, an ATen call, another kernel (a later matmul's epilogue, a reduction)."""
    graph = plan.graph
    if e in graph.outputs or any(e in pair for pair in graph.mutations):
        return True
    if any(plan.kinds[user] is NodeKind.EXTERN for user in graph.users(e)):  # (a template's operand too)
        return True
    for step in steps:
        if isinstance(step, Kernel) and e in _reads(plan, step):
            return True
    return any(other != e and e in _epilogue_reads(plan, k) for other, k in kernels.items())


def _reads(plan: Plan, kernel: Kernel) -> set[str]:
    """What a kernel left after the split will read: the loads of its remaining stores."""
    graph = plan.graph
    found, seen, stack = set(), set(), list(kernel.stores)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in kernel.loads:
            found.add(name)
            continue
        stack += graph[name].inputs()
    return found


def _epilogue_reads(plan: Plan, kernel: MatmulKernel) -> set[str]:
    """The matmuls (other than its own) that a matmul kernel's epilogue reads."""
    graph = plan.graph
    found, seen, stack = set(), set(), [s for s in kernel.stores if s != kernel.matmul]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if graph[name].op_name in MATMULS and name != kernel.matmul:
            found.add(name)
            continue
        if plan.kinds[name].computed:
            stack += graph[name].inputs()
    return found


def _epilogues(plan: Plan, externs: list[str]) -> dict[str, list[str]]:
    """Store -> the matmuls of its stage it reads (in graph order), for the stores of pointwise
    kernels that read the last of them only at its own element (`_at_own_element`)."""
    found: dict[str, list[str]] = {}
    for kernel in plan.kernels:
        if not isinstance(kernel, PointwiseKernel):
            continue
        mine = [e for e in externs if e in kernel.loads and plan.stage_of[e] == kernel.stage]
        after = {e: _downstream(plan, kernel, e) for e in mine}
        for store in kernel.stores:
            reads = [e for e in mine if store in after[e]]
            if reads and _at_own_element(plan, store, reads[-1], after[reads[-1]]):
                found[store] = reads
    return found


def _downstream(plan: Plan, kernel: Kernel, e: str) -> set[str]:
    """The nodes `kernel` computes from the product `e`."""
    inside, found, stack = set(kernel.nodes), set(), [e]
    while stack:
        for user in plan.graph.users(stack.pop()):
            if user in inside and user not in found:
                found.add(user)
                stack.append(user)
    return found


def at_product(index: tuple[Expr, ...], root: tuple[Expr, ...]) -> bool:
    """Whether the product read at `index` is read at the tile's element `root`: equal once each
    `c*d*(E // d) + c*(E % d)` a reshape there and back leaves is written `c*E` again
    (nn.Linear on [B, S, K]: the [B*S, N] product viewed as [B, S, N] is read at
    `5*(x0 // 5) + x0 % 5`, which is x0)."""
    return len(index) == len(root) and all(_recombined(e) == r for e, r in zip(index, root))


def _recombined(expr: Expr) -> Expr:
    terms, const = dict(expr.terms), expr.const
    while True:
        pair = next(
            (
                (atom, whole)
                for atom in terms
                if isinstance(atom, Mod)
                and terms.get(whole := FloorDiv(atom.expr, atom.divisor)) == terms[atom] * atom.divisor
            ),
            None,
        )
        if pair is None:
            return Expr._make(terms, const)
        atom, whole = pair
        coeff = terms.pop(atom)
        del terms[whole]
        merged = Expr._make(terms, const) + atom.expr * coeff
        terms, const = dict(merged.terms), merged.const


def _at_own_element(plan: Plan, store: str, e: str, after: set[str]) -> bool:
    """Whether `store`, evaluated at the element of its shape that row-major order puts at the
    product's element (i, j), reads the product `e` only at (i, j), through pointwise nodes and
    reshapes of the product's size: the index rules of the lowering, run backwards from the store."""
    graph = plan.graph
    product = graph[e].meta
    space = IterationSpace(product.shape)
    root = tuple(space.var(d) for d in range(len(product.shape)))
    meta = graph[store].meta
    if not isinstance(meta, TensorMeta) or meta.numel != product.numel or meta.device != product.device:
        return False
    stack = [(store, reshape_index(root, product.shape, meta.shape))]
    seen = set()
    while stack:
        name, index = stack.pop()
        if (name, index) in seen:
            continue
        seen.add((name, index))
        if name == e:
            if not at_product(index, root):
                return False
            continue
        if name not in after:
            continue  # read from memory, or not on a path from the product: any index
        node = graph[name]
        if node.meta.numel != product.numel:
            return False
        kind = plan.kinds[name]
        if kind is NodeKind.POINTWISE:
            for i in node.inputs():
                stack.append((i, broadcast_index(index, graph[i].meta.shape)))
        elif kind in (NodeKind.VIEW, NodeKind.EXTERN) and node.op_name in SAME_INDEX:  # (a chain's ATen views)
            stack.append((node.inputs()[0], index))
        elif kind in (NodeKind.VIEW, NodeKind.EXTERN) and node.op_name in RESHAPES:
            source = node.inputs()[0]
            stack.append((source, reshape_index(index, node.meta.shape, graph[source].meta.shape)))
        else:
            return False
    return True


def choices(plan: Plan) -> list[str]:
    """A line for each matmul of `plan`: how it runs and why (`explain` prints them)."""
    graph, lines = plan.graph, []
    externs = [s.node for s in plan.steps if isinstance(s, Extern) and graph[s.node].op_name in MATMULS]
    readers = _epilogues(plan, externs) if externs else {}
    for step in plan.steps:
        if isinstance(step, MatmulKernel):
            epilogue = epilogue_nodes(graph, step)
            lines.append(
                f"{step.matmul} {_sizes(graph, step.matmul)}: Triton template {step.name} ({step.why}); "
                f"epilogue {', '.join(epilogue) or '-'}; writes {', '.join(step.stores)}"
            )
            text = {
                "chained": f"chained into {step.name}: computed where it reads operand a, never written",
                "sibling": f"a sibling in {step.name}: its own K loop at the epilogue's tile, never written",
            }
            lines += [f"{k.matmul} {_sizes(graph, k.matmul)}: {text[how]} ({k.why})" for k, how in folded(step)]
        elif isinstance(step, Extern) and step.node in externs:
            epilogue = any(step.node in hosts for hosts in readers.values())
            lines.append(f"{step.node} {_sizes(graph, step.node)}: {choice(graph, step.node, epilogue)[1]}")
    return lines


def _sizes(graph: Graph, name: str) -> str:
    a, b, _ = operands(graph, name)
    meta, am = graph[name].meta, graph[a].meta
    batch = f"{meta.shape[0]} x " if len(meta.shape) == 3 else ""
    dtype = str(meta.dtype).removeprefix("torch.")
    return f"{batch}[{meta.shape[-2]}, {am.shape[-1]}] @ [{am.shape[-1]}, {meta.shape[-1]}] {dtype}"
