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
are the caller's) and builds a second order greedily: of the steps whose inputs are
ready, the one that adds the fewest bytes (allocated minus freed), ties in the
plan's order. It keeps the order with the lower modeled peak, the plan's on a
tie, as Inductor's `reorder_for_peak_memory` compares several orders by their
estimated peak. Externs that mutate or draw random numbers keep their order
among themselves. Then each view extern moves to just before its first reader,
so the Python calls that make views overlap the GPU's work instead of delaying
the first launch (`_views_late`).
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from dataclasses import dataclass, replace

import torch

from minicomp.plan.steps import Extern, Kernel, Plan
from minicomp.plan.storages import Storages, defines, uses

Step = Kernel | Extern


def order(plan: Plan, freed_inputs: frozenset[str] = frozenset()) -> Plan:
    """The plan with its steps in the order of lower modeled peak memory, each view just before
    its first use. `freed_inputs`: inputs the caller hands over (a boxed backward's saved
    activations), freed at their last use."""
    storages = Storages.of(plan)
    touched = [uses(plan, step) for step in plan.steps]
    model = _Model(plan, storages, freed_inputs, touched)
    steps = list(range(len(plan.steps)))
    _check_dependencies(plan, model)
    greedy = model.greedy()
    if model.peak(greedy) < model.peak(steps):
        steps = greedy
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
            now += sum(self.storages.size[o] for o in self.allocates[i])
            if now > high:
                high, at = now, position
            now -= self._freed(i, left)
            self._run(i, left)
        return high, at

    def alive(self, order: list[int], at: int) -> set[str]:
        """The memories held once the step at position `at` of `order` has allocated its own."""
        left = Counter(o for t in self.touches for o in t)
        alive = {o for o in self.storages.inputs if o in self.freeable}
        for i in order[: at + 1]:
            alive |= self.allocates[i]
            if i == order[at]:
                break
            alive -= {o for o in self.touches[i] if left[o] == 1 and o in self.freeable}
            self._run(i, left)
        return alive

    def greedy(self) -> list[int]:
        """Of the steps ready to run, always the one that adds the fewest bytes (allocated less
        freed; the lower index on a tie). A heap of the ready steps' (bytes, index): a step's key
        changes only where a memory it touches gets down to its last toucher, so only the ready
        touchers of such a memory are pushed again (stale entries are skipped)."""
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

        def push(i: int) -> None:
            keys[i] = (grows[i] - self._freed(i, left), i)
            heapq.heappush(heap, keys[i])

        ready = {i for i, n in enumerate(waiting) if n == 0}
        for i in ready:
            push(i)
        order: list[int] = []
        while ready:
            entry = heapq.heappop(heap)
            best = entry[1]
            if best not in ready or keys[best] != entry:
                continue
            self._run(best, left)
            ready.discard(best)
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
        return order


def _keeps_order(plan: Plan, step: Step) -> bool:
    """An extern whose place among its kind matters: it writes memory or draws random numbers."""
    if not isinstance(step, Extern):
        return False
    target = plan.graph[step.node].target
    if not isinstance(target, torch._ops.OpOverload):
        return target is not operator.getitem
    return target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags
