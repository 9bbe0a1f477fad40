"""The order a generated `call` runs its steps in: the plan's, or one that needs less memory.

fusion.plan orders the steps by stage, which is a valid order but not a frugal
one: a chain of view externs counts a stage each, so in stage order a backward
runs the matmul that computes an MLP's hidden-state gradient, then the kernel
that turns it into the gate and up gradients, and only then the matmul for
`w_down`'s gradient, the last use of the saved activation it reads: three
large buffers alive with the saved one.

`order` replays the plan's steps against a model of the memory they hold
(storages.py: what each step allocates, what is freed after the step that
uses it last; of the inputs, only the backward's saved activations, which
AOTAutograd hands over, are freed by their last use: parameters and tangents
are the caller's; a kernel's store that codegen/reuse.py may write over a buffer
the kernel reads for the last time, or that plan/padded_writes.py writes inside
the padded buffer it is copied to, holds no memory of its own: `_written_over`)
and builds other orders greedily: of the steps whose inputs are ready, the one
that adds the fewest bytes (allocated minus freed), ties in the plan's order; in
variants, a large memory freed at once by the few steps that read it last
(`release`), a recomputation off the gradients' path put off until that path
needs it (`defer`: H200 training peaks Llama 817 -> 728 MiB, BERT 549 -> 429,
GPT-2 872 -> 678 with the model's fixes). It keeps the order of the lowest
modeled peak, the plan's on a tie, as Inductor's `reorder_for_peak_memory`
compares several orders by their estimated peak. Externs that mutate or draw
random numbers keep their order among themselves. Then each view extern moves to just before its first reader,
so the Python calls that make views overlap the GPU's work instead of delaying
the first launch (`_views_late`).
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from dataclasses import dataclass, replace

import torch

from minicomp.ir import TensorMeta
from minicomp.plan.steps import Extern, Kernel, Plan, PointwiseKernel, ReductionKernel
from minicomp.plan.storages import Storages, defines, uses

Step = Kernel | Extern
RELEASE_STEPS = 64  # the most steps `_Model.greedy` runs at once to free a large memory
MOVING = {"permute", "transpose", "t", "flip", "roll", "cat", "as_strided", "diagonal"}  # ops no store is written over


def order(plan: Plan, freed_inputs: frozenset[str] = frozenset()) -> Plan:
    """The plan with its steps in the order of lower modeled peak memory, each view just before
    its first use. `freed_inputs`: inputs the caller hands over (a boxed backward's saved
    activations), freed at their last use."""
    storages = Storages.of(plan)
    touched = [uses(plan, step) for step in plan.steps]
    model = _Model(plan, storages, freed_inputs, touched)
    steps = list(range(len(plan.steps)))
    _check_dependencies(plan, model)
    lowest = model.peak(steps)
    for release, defer in ((False, False), (True, False), (False, True), (True, True)):
        candidate = model.greedy(release, defer)
        if (peak := model.peak(candidate)) < lowest:
            steps, lowest = candidate, peak
    steps = _views_late(plan, storages, steps, touched)
    return replace(plan, steps=[plan.steps[i] for i in steps])


@dataclass
class Peak:
    """The modeled memory of a plan run in its order: the most bytes held at once, after which
    step, and the memories alive then (owner -> bytes), as `order` compares orders by."""

    bytes: int
    step: str
    alive: dict[str, int]


def peak(plan: Plan, freed_inputs: frozenset[str] = frozenset()) -> Peak:
    """`plan`'s modeled peak in its own order (inputs counted where `freed_inputs` frees them:
    a boxed backward's saved activations, handed over; the caller's other inputs are not)."""
    storages = Storages.of(plan)
    model = _Model(plan, storages, freed_inputs, [uses(plan, step) for step in plan.steps])
    order = list(range(len(plan.steps)))
    high, at = model.peak_at(order)
    step = "(the inputs)" if at < 0 else _label(plan.steps[order[at]])
    return Peak(high, step, {o: storages.size[o] for o in model.alive(order, at)})


def _views_late(plan: Plan, storages: Storages, steps: list[int], touched: list[set[str]]) -> list[int]:
    """`steps` with each view extern (a `view`, `permute`, ... of another value) moved to just
    before the first step that reads it. A backward starts with dozens of them (the transposed
    weights and saved activations its matmuls read): run first, their Python calls keep the
    GPU waiting for the first matmul; run late, they overlap the GPU's work. A
    `getitem` stays where it is (it is what lets its tuple go)."""
    view = {
        i
        for i in steps
        if isinstance(plan.steps[i], Extern)
        and plan.graph[plan.steps[i].node].target is not operator.getitem
        and storages.owner.get(plan.steps[i].node) != plan.steps[i].node
        and not _keeps_order(plan, plan.steps[i])
    }
    made_by = {plan.steps[i].node: i for i in view}
    done: set[int] = set()
    out: list[int] = []

    def emit(i: int) -> None:
        for name in touched[i]:
            j = made_by.get(name)
            if j is not None and j != i and j not in done:
                emit(j)
        done.add(i)
        out.append(i)

    for i in steps:
        if i not in view:
            emit(i)
    return out + [i for i in steps if i not in done]  # views nothing reads (returned ones)


def _check_dependencies(plan: Plan, model: _Model) -> None:
    """Raise when a step reads a value that only a later step of the plan makes: a fusion bug
    (a kernel and an extern reading each other's values) that no order can run. Checked here,
    because the greedy order would otherwise leave such steps out and the module miss values."""
    for i, before in enumerate(model.after):
        late = sorted(j for j in before if j > i)
        if late:
            raise RuntimeError(
                f"the plan's step {_label(plan.steps[i])} reads what a later step ({_label(plan.steps[late[0]])}) makes"
            )


def _label(step: Step) -> str:
    return step.name if isinstance(step, Kernel) else f"extern {step.node}"


class _Model:
    def __init__(self, plan: Plan, storages: Storages, freed_inputs: frozenset[str], touched: list[set[str]]):
        self.steps = plan.steps
        self.storages = storages
        owner = storages.owner
        self.touches = [{owner[n] for n in names if n in owner} for names in touched]
        self.allocates = [
            {owner[n] for n in defines(s) if owner.get(n) == n and n not in storages.inputs} for s in plan.steps
        ]
        self.freeable = {
            o for o in storages.size if o not in storages.kept and (o in freed_inputs or o not in storages.inputs)
        }
        self.held_inputs = sum(storages.size[o] for o in storages.inputs if o in self.freeable)
        made_by = {n: i for i, s in enumerate(plan.steps) for n in defines(s)}
        self.after = [{made_by[n] for n in names if made_by.get(n, i) != i} for i, names in enumerate(touched)]
        ordered = [i for i, s in enumerate(plan.steps) if _keeps_order(plan, s)]
        for earlier, later in zip(ordered, ordered[1:]):
            self.after[later].add(earlier)
        self.over = [_written_over(plan, storages, step) for step in plan.steps]
        gradients = {n for n in plan.graph.inputs if n.startswith("tangents")}  # AOTAutograd's names
        self.floating: list[bool] = []  # off the gradients' path: reads what the forward saved alone
        for i, names in enumerate(touched):
            self.floating.append(not (names & gradients) and all(j < i and self.floating[j] for j in self.after[i]))

    def _change(self, i: int, left: Counter) -> tuple[int, int]:
        """(the bytes step `i` allocates, the bytes freed once it has run), where each memory has
        `left` steps still to touch it. A store the kernel may write over a buffer it reads for the
        last time (codegen/reuse.py) allocates nothing, and that buffer is not freed: it holds the
        store."""
        dying = {o for o in self.touches[i] if left[o] == 1 and o in self.freeable}
        grows, taken = 0, set()
        for made in self.allocates[i]:
            buffer = next((b for b in self.over[i].get(made, ()) if b in dying and b not in taken), None)
            if buffer is None:
                grows += self.storages.size[made]
            else:
                taken.add(buffer)
        return grows, sum(self.storages.size[o] for o in dying - taken)

    def _freed(self, i: int, left: Counter) -> int:
        return sum(self.storages.size[o] for o in self.touches[i] if left[o] == 1 and o in self.freeable)

    def _run(self, i: int, left: Counter) -> None:
        for o in self.touches[i]:
            left[o] -= 1

    def peak(self, order: list[int]) -> int:
        """The most bytes held at once while the steps run in `order` (of inputs, the freed ones)."""
        return self.peak_at(order)[0]

    def peak_at(self, order: list[int]) -> tuple[int, int]:
        """(that peak, the position in `order` of the step it falls at: -1 for the inputs alone)."""
        left = Counter(o for t in self.touches for o in t)
        now = high = self.held_inputs
        at = -1
        for position, i in enumerate(order):
            grows, freed = self._change(i, left)
            now += grows
            if now > high:
                high, at = now, position
            now -= freed
            self._run(i, left)
        return high, at

    def alive(self, order: list[int], at: int) -> set[str]:
        """The memories held once the step at position `at` of `order` has allocated its own (a
        store written over a dying buffer in that buffer's place)."""
        left = Counter(o for t in self.touches for o in t)
        alive = {o for o in self.storages.inputs if o in self.freeable}
        for i in order[: at + 1]:
            dying = {o for o in self.touches[i] if left[o] == 1 and o in self.freeable}
            for made in self.allocates[i]:
                buffer = next((b for b in self.over[i].get(made, ()) if b in dying and b in alive), None)
                alive.discard(buffer)
                dying.discard(buffer)
                alive.add(made)
            if i == order[at]:
                break
            alive -= dying
            self._run(i, left)
        return alive

    def greedy(self, release: bool = False, defer: bool = False) -> list[int]:
        """Of the steps ready to run, always the one that adds the fewest bytes (allocated less
        freed; the lower index on a tie). A heap of the ready steps' (bytes, index): a step's key
        changes only where a memory it touches gets down to its last toucher, so only the ready
        touchers of such a memory are pushed again (stale entries are skipped).

        `release`: a step that allocates a large memory (an eighth or more of what is held) is
        followed at once by the steps left that touch it and what they wait for, where those free
        more than they allocate and are few (RELEASE_STEPS). The rule above alone is myopic: the
        logits' gradient waits for the weight gradient that reads it, which waits behind the
        kernel that recomputes the activation it reads, a step that only allocates.
        `defer`: a step off the gradients' path (`floating`: it reads no tangent nor anything
        computed from one) that adds bytes comes after every step that does not, until running
        it lets a step of that path run (through at most four steps off it, each waiting for
        nothing else): a backward's recomputed GELU output waits for the gradient its matmul
        multiplies it by. Each rule helps some graphs and hurts others; `order` keeps whichever
        order models the lowest peak."""
        left = Counter(o for t in self.touches for o in t)
        waiting = [len(a) for a in self.after]  # steps each step still waits for
        unblocks: list[list[int]] = [[] for _ in self.steps]
        for i, before in enumerate(self.after):
            for j in before:
                unblocks[j].append(i)
        touching: dict[str, list[int]] = {}
        for i, memories in enumerate(self.touches):
            for o in memories:
                touching.setdefault(o, []).append(i)
        grows = [sum(self.storages.size[o] for o in made) for made in self.allocates]
        heap: list[tuple[int, int]] = []
        keys: dict[int, tuple[int, int]] = {}

        order: list[int] = []
        done = [False] * len(self.steps)
        held = self.held_inputs
        early = 1 + sum(self.storages.size.values())  # a step whose result nothing could read yet waits

        def lets_run(i: int, depth: int) -> bool:
            """Whether running step i lets a step of the gradients' path run (through steps off it
            that wait for nothing else, `depth` deep)."""
            return any(
                waiting[j] == 1 and (not self.floating[j] or (depth > 0 and lets_run(j, depth - 1)))
                for j in unblocks[i]
            )

        def push(i: int) -> None:
            net = grows[i] - self._freed(i, left)
            idle = defer and net > 0 and self.floating[i] and not lets_run(i, 4)
            keys[i] = (net + idle * early, i)
            heapq.heappush(heap, keys[i])

        ready = {i for i, n in enumerate(waiting) if n == 0}
        for i in ready:
            push(i)

        def take(best: int) -> None:
            nonlocal held
            grown, freed = self._change(best, left)
            held += grown - freed
            self._run(best, left)
            ready.discard(best)
            done[best] = True
            order.append(best)
            for o in self.touches[best]:
                if left[o] == 1:
                    for j in touching[o]:
                        if j in ready:
                            push(j)
            for i in unblocks[best]:
                waiting[i] -= 1
                if waiting[i] == 0:
                    ready.add(i)
                    push(i)
                elif waiting[i] == 1:  # the step it waits for last is no longer early
                    for j in self.after[i]:
                        if j in ready:
                            push(j)

        while ready:
            entry = heapq.heappop(heap)
            best = entry[1]
            if best not in ready or keys[best] != entry:
                continue
            take(best)
            for made in self.allocates[best] if release else ():
                if self.storages.size[made] * 8 >= held:
                    for i in self._releasing(made, left, touching, done):
                        take(i)
        return order

    def _releasing(self, memory: str, left: Counter, touching: dict[str, list[int]], done: list[bool]) -> list[int]:
        """The steps left that touch `memory` and those they wait for, in the plan's order, where
        they are at most RELEASE_STEPS and run in that order hold fewer bytes after than before;
        else none."""
        if memory not in self.freeable:
            return []
        need: set[int] = set()
        stack = [i for i in touching.get(memory, ()) if not done[i]]
        while stack:
            i = stack.pop()
            if i in need or done[i]:
                continue
            need.add(i)
            if len(need) > RELEASE_STEPS:
                return []
            stack.extend(j for j in self.after[i] if not done[j])
        steps = sorted(need)  # every step's dependencies come before it in the plan
        trial, change = Counter(left), 0
        for i in steps:
            grown, freed = self._change(i, trial)
            change += grown - freed
            self._run(i, trial)
        return steps if change < 0 else []


def _written_over(plan: Plan, storages: Storages, step: Step) -> dict[str, tuple[str, ...]]:
    """Of a pointwise or reduction kernel's stores, each that may go into the memory of a buffer
    the kernel reads: {store: those buffers}. The model's stand-in for codegen/reuse.py, which
    decides once the order is known (where the buffer dies, whether each element is read by the
    program that overwrites it): a store computed from the buffer through no op that moves
    elements (MOVING: a transposed copy is never written over its source), of the buffer's
    dtype and device and at most its element count, a sixteenth less at most (the buffer padded),
    or a sixteenth more through a `constant_pad_nd` (BERT's logits' gradient padded to [rows,
    V + 6] for the matmuls, which plan/padded_writes.py has the gradient's kernel write inside,
    after the schedule); that is new memory (views of it may follow) and does not outlive the
    call; over a buffer that owns its memory, outlives nothing and is no input but a donated one
    (a backward's saved logits, which take their gradient)."""
    if not isinstance(step, (PointwiseKernel, ReductionKernel)):
        return {}
    graph, over = plan.graph, {}
    buffers = [
        b
        for b in dict.fromkeys(step.loads)
        if storages.owns_memory(b)
        and b not in storages.kept
        and (b not in storages.inputs or b in plan.donated)
        and isinstance(graph[b].meta, TensorMeta)
    ]
    for store in step.stores:
        meta = graph[store].meta
        if storages.owner.get(store) != store or store in storages.kept or not isinstance(meta, TensorMeta):
            continue
        path = _between(plan, step, store)
        alike = tuple(
            b
            for b in buffers
            if (graph[b].meta.dtype, graph[b].meta.device) == (meta.dtype, meta.device)
            and b in path
            and not path[b] & MOVING
            and meta.numel * 16 <= graph[b].meta.numel * (17 if "constant_pad_nd" in path[b] else 16)
            and graph[b].meta.numel * 16 <= meta.numel * 17
        )
        if alike:
            over[store] = alike
    return over


def _between(plan: Plan, step: Step, store: str) -> dict[str, frozenset[str]]:
    """{a value the kernel loads that `store` is computed from: the ops of the kernel's nodes on
    the way from it to the store}."""
    inside, found = set(step.nodes), {}

    def walk(name: str) -> dict[str, frozenset[str]]:
        if name not in inside:
            return {name: frozenset()}
        if name not in found:
            found[name] = {}
            node, reached = plan.graph[name], {}
            for source in node.inputs():
                for load, ops in walk(source).items():
                    reached[load] = reached.get(load, frozenset()) | ops | {node.op_name.strip("_")}
            found[name] = reached
        return found[name]

    return walk(store)


def _keeps_order(plan: Plan, step: Step) -> bool:
    """An extern whose place among its kind matters: it writes memory or draws random numbers."""
    if not isinstance(step, Extern):
        return False
    target = plan.graph[step.node].target
    if not isinstance(target, torch._ops.OpOverload):
        return target is not operator.getitem
    return target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
