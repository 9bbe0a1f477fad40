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
epilogue computed in the prologue too, its kernel gone (plan/matmul_folding.py). A product only another
template's epilogue reads may be its *sibling*, a second accumulator in that kernel
(config "matmul_siblings", off: measured slower).

A product of one row whose b is read along K (a decoding step's `x @ W.T`) on CUDA runs as the
template's one-row form in every setting (config "matmul_rows", from "matmul_row_min_k" = 512 of
K): no tl.dot, the weight read once near the memory's speed (codegen/matmul.py).

The setting (config "matmul", MINICOMP_MATMUL): "library" (default) keeps every other matmul an ATen call;
"template" makes every matmul the template can run one (the CPU tests: Triton's interpreter
runs tl.dot); "auto" keeps ATen's calls on the CPU, and on CUDA takes the template for a
matmul with an epilogue to fuse (of sizes >= 16, between config "matmul_min_macs" and
"matmul_max_macs" multiply-adds: a smaller one is not worth a compile of its tiles) where
timing it against cuBLAS + an epilogue kernel on this GPU says it is faster
(runtime/matmul_choice.py, remembered in the tuning cache: a warm process measures nothing); a
matmul without an epilogue stays with cuBLAS, unless it would end a chain (`chain_ends`). float32 uses TF32 where
`torch.backends.cuda.matmul.allow_tf32` allows it (read when the graph compiles, as Inductor does).
"""

from __future__ import annotations

from dataclasses import replace

from minicomp import config
from minicomp.ir import Graph, TensorMeta
from minicomp.lowering import ops
from minicomp.lowering.layout import output_strides
from minicomp.lowering.ops import NodeKind
from minicomp.plan.matmul_folding import chain_ends, chainable, fold_siblings
from minicomp.plan.matmul_reads import (
    MATMULS,
    epilogue_nodes,
    epilogues,
    folded,
    macs,
    members,
    operands,
    read_elsewhere,
    refusal,
)
from minicomp.plan.steps import Extern, Kernel, MatmulKernel, Plan, PointwiseKernel, Refusal
from minicomp.runtime.launch_spec import one_row

MODES = ("auto", "template", "library")


def mode() -> str:
    """The setting, validated."""
    value = config.get("matmul")
    if value not in MODES:
        raise config.ConfigError(f"MINICOMP_MATMUL (matmul) must be one of {', '.join(MODES)}, not {value!r}")
    return value


def choice(graph: Graph, name: str, epilogue: bool) -> tuple[bool, str]:
    """(whether the template runs matmul `name`, why), by the setting; `epilogue`: whether it has
    pointwise consumers to fuse."""
    why = refusal(graph, name)
    if why is not None:
        return False, f"ATen: {why}"
    setting = mode()
    if setting != "template" and _row_product(graph, name):
        return True, f"template: one row read along K, on CUDA (config matmul_rows; {setting})"
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


def _row_product(graph: Graph, name: str) -> bool:
    """Whether matmul `name` is a product of one row whose b is read along K, on CUDA, that config
    "matmul_rows" runs as the template's one-row form in any setting: a decoding step's projections
    (cuBLAS took 1.1-2.2x its time at every one measured, docs/experiments.md)."""
    if not config.get("matmul_rows") or refusal(graph, name) is not None:
        return False
    meta = graph[name].meta
    a, b, _ = operands(graph, name)
    return (
        meta.device.type == "cuda"
        and one_row(meta.shape[-2], graph[b].meta.stride)
        and graph[a].meta.shape[-1] >= config.get("matmul_row_min_k")
    )


def templated(plan: Plan, fill) -> Plan:
    """`plan` with each matmul the setting chooses as a `MatmulKernel` that computes its epilogue;
    the same plan when none is. `fill(graph, kernel, kinds, stage_of, materialized)`: fusion.py's
    walk from a kernel's stores to what it computes and reads."""
    graph = plan.graph
    externs = [s.node for s in plan.steps if isinstance(s, Extern) and graph[s.node].op_name in MATMULS]
    setting = mode()
    if not externs or (setting != "template" and _all_on_cpu(graph, externs)):
        return plan
    if setting == "library" and not any(_row_product(graph, e) for e in externs):
        return plan
    readers = epilogues(plan, externs)
    chosen = {}
    for e in externs:
        ok, why = choice(graph, e, any(e in hosts for hosts in readers.values()))
        if ok:
            chosen[e] = why
    if setting == "auto":
        chosen |= chain_ends(plan, externs, readers, chosen)
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
        fold_siblings(plan, steps, kernels, materialized)
    steps = _prologues(plan, steps, kernels, materialized)
    # the product is written only where something outside its kernel reads it
    for e, kernel in kernels.items():
        if not kernel.stores or read_elsewhere(plan, steps, kernels, e):
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


def _prologues(plan: Plan, steps: list, kernels: dict[str, MatmulKernel], materialized: set[str]) -> list:
    """`steps` with each operand that only its matmul reads, written by a pointwise kernel of an
    earlier stage (a scale, a cast: `(x * s) @ w`), computed by the template as it loads it: taken
    out of that kernel's stores (the kernel dropped when nothing is left) and out of memory. The
    operand may be reached through ATen views of such a value read by nothing else (linear's
    `t(w.to(bf16))`): those views are evaluated in the kernel too, their ATen calls dropped.
    An `a` operand that is all another matmul kernel writes (`chainable`: an MLP's hidden layer)
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
            elif x == a and (inner := chainable(plan, kernels, kernel, base, reader, outputs)) is not None:
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


def _inlined_views(plan: Plan, kernel: MatmulKernel) -> set[str]:
    """The ATen views between a prologue operand and the value it is computed from (`_prologues`),
    in the kernel and in the kernels of its chain."""
    found = set()
    for x in (x for k in members(kernel) for x in k.prologue):
        while plan.kinds[x] is NodeKind.EXTERN and plan.graph[x].op_name in ops.VIEWS:
            found.add(x)
            x = plan.graph[x].inputs()[0]
    return found


def choices(plan: Plan) -> list[str]:
    """A line for each matmul of `plan`: how it runs and why (`explain` prints them)."""
    graph, lines = plan.graph, []
    externs = [s.node for s in plan.steps if isinstance(s, Extern) and graph[s.node].op_name in MATMULS]
    readers = epilogues(plan, externs) if externs else {}
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
