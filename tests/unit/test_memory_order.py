"""Memory of a generated call: the order of its steps (schedule.py) and outputs written in place
over a buffer the kernel reads for the last time (codegen/reuse.py).

Issue #16: a decoder block's training step held 817 MiB at its peak against Inductor's 663; the
backward ran the MLP's weight-gradient matmul after the kernel that writes the gate and up
gradients, and allocated those next to the matmul result they came from.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import check

import minicomp
from minicomp import config, ir
from minicomp.plan import fusion, schedule, storages
from minicomp.runtime import tuning
from minicomp.tools.workloads import WORKLOADS, llama_block

IN_PLACE = re.compile(r"^\s*(\w+) = (?:reinterpret\()?(\w+)(?:, .*\))?  # in \2's memory", re.M)


def reused(source: str) -> dict[str, str]:
    """store -> the buffer whose memory it was written into, from a module's `call`."""
    return {m.group(1): m.group(2) for m in IN_PLACE.finditer(source)}


def mlp(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def test_intermediate_is_written_over_the_matmul_result_it_reads(device):
    x, w, w2 = (torch.randn(s, device=device) for s in ((64, 32), (32, 48), (48, 16)))
    source = check(lambda x, w, w2: (torch.relu(x @ w) * 2) @ w2, x, w, w2)
    assert reused(source) == {"mul": "mm"}


def test_output_is_never_written_in_place(device):
    x, w = torch.randn(64, 32, device=device), torch.randn(32, 48, device=device)
    source = check(lambda x, w: torch.relu(x @ w) * 2, x, w)
    assert reused(source) == {}


def test_buffer_read_at_other_addresses_is_not_overwritten(device):
    x, w, w2 = (torch.randn(s, device=device) for s in ((64, 32), (32, 48), (48, 16)))
    source = check(lambda x, w, w2: (torch.relu(x @ w).flip(0) * 2) @ w2, x, w, w2)
    assert reused(source) == {}


def test_buffer_read_again_later_is_not_overwritten(device):
    x, w = (torch.randn(s, device=device) for s in ((64, 32), (32, 48)))
    source = check(lambda x, w: (lambda y: (torch.relu(y) * 2).T @ y)(x @ w), x, w)
    assert reused(source) == {}  # mm is read by the matmul that reads the pointwise kernel's result


def test_a_reader_that_can_go_first_lets_the_kernel_write_in_place(device):
    # the other matmul that reads mm needs nothing of the kernel's: the schedule runs it first
    # (its model counts a store written over a buffer that dies there), and the kernel then
    # writes over mm
    x, w, w2 = (torch.randn(s, device=device) for s in ((64, 32), (32, 48), (48, 16)))
    source = check(lambda x, w, w2: (lambda y: ((torch.relu(y) * 2) @ w2, y @ w2))(x @ w), x, w, w2)
    assert reused(source) == {"mul": "mm"}


def test_input_is_never_overwritten(device):
    x, w2 = torch.randn(64, 48, device=device), torch.randn(48, 16, device=device)
    source = check(lambda x, w2: (torch.relu(x) * 2) @ w2, x, w2)
    assert reused(source) == {}


@pytest.fixture
def saved_hidden_state():
    """The forward saves SwiGLU's hidden state (config "recompute_for_memory" off: on, the backward
    recomputes it, test_autograd.py)."""
    with config.override(recompute_for_memory=False):
        yield


@pytest.mark.usefixtures("saved_hidden_state")
def test_backward_frees_the_saved_activation_before_allocating_gradients(device):
    """The weight gradient of `w_down` (the last use of the saved hidden state) runs before the
    kernel that writes the gate and up gradients, and one of those goes into the matmul result
    it reads; the gradients match eager."""
    x, wg, wu, wd = (
        torch.randn(s, device=device, requires_grad=True) for s in ((256, 16), (16, 64), (16, 64), (64, 16))
    )
    ref = [t.detach().clone().requires_grad_() for t in (x, wg, wu, wd)]
    fn = minicomp.jit(mlp)
    grad = torch.randn(256, 16, device=device)
    fn(x, wg, wu, wd).backward(grad)
    mlp(*ref).backward(grad)
    for a, b in zip((x, wg, wu, wd), ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)
    backward = fn.entry(x, wg, wu, wd).backward.source
    call = backward[backward.index("def call_boxed") :]
    lines = call.splitlines()
    product = r"= (torch\.ops\.aten\.mm\.default\._op|torch\._C\._VariableFunctions\.mm)\(permute"
    reads_saved = next(i for i, line in enumerate(lines) if re.search(product, line))
    first_kernel = next(i for i, line in enumerate(lines) if line.strip().startswith("launch_"))
    assert reads_saved < first_kernel, call
    assert len(reused(backward)) == 1, call


def _block_plan(freed: bool):
    """The decoder block's backward plan at tiny sizes, its model, and its saved activations."""
    from functorch.compile import aot_function, make_boxed_func

    from minicomp import capture
    from minicomp.dispatch.autograd import partition, saved_activations

    plans, forward = {}, {}

    def compiler(role):
        def compile_fn(gm, example_inputs):
            if role == "forward":
                forward["gm"] = gm
            else:
                saved = saved_activations(forward["gm"], gm) if freed else frozenset()
                plans["plan"], plans["saved"] = fusion.plan(ir.from_fx(gm)), saved
            return make_boxed_func(gm.forward)

        return compile_fn

    inputs = WORKLOADS["llama_block_fwbw"].make(8, torch.float32, torch.device("cpu"))
    fn = aot_function(
        llama_block,
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        partition_fn=partition,
        decompositions=capture.decompositions(),
    )
    fn(*inputs).sum().backward()
    return plans["plan"], plans["saved"]


def test_chosen_order_is_valid_and_never_models_a_higher_peak():
    plan, saved = _block_plan(freed=True)
    assert saved and not any(name.startswith(("primals", "tangents")) for name in saved)
    ordered = schedule.order(plan, saved)
    model = schedule._Model(plan, storages.Storages.of(plan), saved, [storages.uses(plan, s) for s in plan.steps])
    position = {id(step): i for i, step in enumerate(plan.steps)}
    assert model.peak([position[id(s)] for s in ordered.steps]) <= model.peak(list(range(len(plan.steps))))
    assert sorted(map(id, ordered.steps)) == sorted(map(id, plan.steps))
    ready = set(plan.graph.inputs)
    for step in ordered.steps:  # every step after what it reads
        assert storages.uses(plan, step) - set(storages.defines(step)) <= ready, step
        ready |= set(storages.defines(step))


def test_the_reported_peak_is_the_models():
    # explain's planned peak (schedule.peak) is the peak `order` compares orders by, and what is
    # alive then adds up to it
    plan, saved = _block_plan(freed=True)
    ordered = schedule.order(plan, saved)
    model = schedule._Model(
        ordered, storages.Storages.of(ordered), saved, [storages.uses(ordered, s) for s in ordered.steps]
    )
    reported = schedule.peak(ordered, saved)
    assert reported.bytes == model.peak(list(range(len(ordered.steps)))) == sum(reported.alive.values())
    assert reported.bytes > 0 and reported.step != "(the inputs)"


def test_random_externs_keep_their_order():
    def fn(x):
        a = torch.rand_like(x)
        b = torch.rand_like(x)
        return a @ x, b

    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(8, 8))
    plan = fusion.plan(ir.from_fx(gm))
    randoms = [s.node for s in plan.steps if isinstance(s, fusion.Extern) and "rand" in s.node]
    ordered = schedule.order(plan)
    assert [s.node for s in ordered.steps if isinstance(s, fusion.Extern) and "rand" in s.node] == randoms


def test_tuning_times_copies_of_buffers_that_share_memory():
    a = torch.randn(8, 4)
    b = a.as_strided((4, 8), (8, 1))
    c = torch.randn(3)
    private = tuning.unaliased([a, c, b, 5])
    assert private[1] is c and private[3] == 5
    for old, new in ((a, private[0]), (b, private[2])):
        assert new.untyped_storage().data_ptr() != old.untyped_storage().data_ptr()
        assert new.stride() == old.stride() and torch.equal(new, old)


@pytest.mark.gpu  # launch tuning runs on the GPU only
def test_tuned_kernel_that_writes_in_place_is_correct(tmp_path, monkeypatch):
    """Tuning runs a kernel many times; one whose output is in its input's memory must not read
    its own results (the decoder block's backward came out 1e32 off before tuning used copies)."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    x, w, w2 = (torch.randn(s, device="cuda") for s in ((512, 64), (64, 512), (512, 16)))
    fn = lambda x, w, w2: (torch.relu(x @ w) * 3 + 1) @ w2  # noqa: E731
    with config.override(tune_min_numel=0):
        compiled = minicomp.jit(fn)
        torch.testing.assert_close(compiled(x, w, w2), fn(x, w, w2), atol=1e-3, rtol=1e-3)
    assert reused(compiled.source(x, w, w2))


def test_dense_layouts_are_permutations_without_gaps_or_overlap():
    from minicomp.lowering.layout import is_dense

    assert is_dense((4, 32, 3, 128), (12288, 128, 4096, 1))  # a transposed view of [4, 3, 32, 128]
    assert is_dense((2, 1, 5), (5, 99, 1))  # a size-1 dim's stride does not matter
    assert not is_dense((4, 8), (16, 1))  # a gap between rows (a slice)
    assert not is_dense((4, 8), (0, 1))  # a broadcast


def _greedy_by_scan(model) -> list[int]:
    """The greedy rule as first written: every round, the ready step adding the fewest bytes."""
    from collections import Counter

    left = Counter(o for t in model.touches for o in t)
    waiting = [len(a) for a in model.after]
    ready, order = {i for i, n in enumerate(waiting) if n == 0}, []
    while ready:
        best = min(
            ready, key=lambda i: (sum(model.storages.size[o] for o in model.allocates[i]) - model._freed(i, left), i)
        )
        model._run(best, left)
        ready.discard(best)
        order.append(best)
        for i, before in enumerate(model.after):
            if best in before:
                waiting[i] -= 1
                if waiting[i] == 0:
                    ready.add(i)
    return order


@pytest.mark.parametrize("freed", [True, False])
def test_greedy_order_by_heap_is_the_scans(freed):
    # schedule._Model.greedy keeps the ready steps in a heap (a 32-layer backward: 1.2 s of
    # scanning every ready step each round); it must pick exactly what the scan picks
    plan, saved = _block_plan(freed=freed)
    touched = [storages.uses(plan, s) for s in plan.steps]
    model = schedule._Model(plan, storages.Storages.of(plan), saved, touched)
    scan = schedule._Model(plan, storages.Storages.of(plan), saved, touched)
    assert len(plan.steps) > 20
    assert model.greedy() == _greedy_by_scan(scan)


def test_the_model_counts_a_store_written_over_a_dying_donated_input():
    # a backward's saved logits take their gradient (codegen/reuse.py): the schedule's model holds
    # one buffer there, not two, or every order it compares peaks at that kernel alike
    import dataclasses

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a, w: (a * 2) @ w)(torch.randn(64, 32), torch.randn(32, 8))
    plan = fusion.plan(ir.from_fx(gm))
    a = plan.graph.inputs[0]
    donated = dataclasses.replace(plan, donated=frozenset({a}))
    assert schedule.peak(plan, frozenset({a})).bytes == 2 * 64 * 32 * 4  # a and a * 2
    assert schedule.peak(donated, frozenset({a})).bytes == 64 * 32 * 4 + 64 * 8 * 4  # a * 2 in a, then the product


def test_the_model_counts_a_padded_copy_as_written_over_what_it_pads():
    # BERT's logits' gradient padded to [rows, V + 6] for the matmuls: plan/padded_writes.py has
    # the gradient's kernel write inside the padded buffer, after the schedule; the model counts
    # the pad as no new memory (within a sixteenth), or every order peaks alike at the pad
    import dataclasses

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a, w: torch.nn.functional.pad(a * 2, (0, 2)) @ w)(
        torch.randn(64, 32), torch.randn(34, 8)
    )
    plan = fusion.plan(ir.from_fx(gm))
    a = plan.graph.inputs[0]
    donated = dataclasses.replace(plan, donated=frozenset({a}))
    assert schedule.peak(donated, frozenset({a})).bytes < 64 * 32 * 4 + 64 * 34 * 4


def test_large_values_that_share_no_load_are_written_by_kernels_apart():
    # each layer's recomputed norm output in one kernel were all allocated at once (Llama's
    # backward, 64 MiB at its peak); large stores of one stage and shape get a kernel each
    pair = (torch.randn(64, 32), torch.randn(64, 32))
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, y: (x * 2, y * 3))(*pair)
    assert len(fusion.plan(ir.from_fx(gm)).kernels) == 1  # small: one launch
    with config.override(apart_bytes=64 * 32 * 4):
        assert len(fusion.plan(ir.from_fx(gm)).kernels) == 2


def test_order_keeps_the_lowest_modeled_peak_of_its_candidates():
    plan, saved = _block_plan(freed=True)
    model = schedule._Model(plan, storages.Storages.of(plan), saved, [storages.uses(plan, s) for s in plan.steps])
    ordered = schedule.order(plan, saved)
    position = {id(step): i for i, step in enumerate(plan.steps)}
    chosen = model.peak([position[id(s)] for s in ordered.steps])
    candidates = [model.greedy(r, d) for r in (False, True) for d in (False, True)]
    assert all(sorted(c) == list(range(len(plan.steps))) for c in candidates)
    assert chosen == min(model.peak(c) for c in candidates + [list(range(len(plan.steps)))])


def test_a_recomputation_waits_until_the_gradients_path_needs_it():
    # `defer`: a step off the gradients' path (it reads only what the forward saved: BERT's
    # recomputed GELU outputs and float32 copies of q, k and v) that adds bytes runs when a step
    # of that path is about to read it, not at the backward's start beside the logits' gradient
    def backward(saved, w, tangents_1):
        recomputed = saved.float() * 2
        h = torch.relu(torch.relu(tangents_1 @ w) @ w.T)
        return h.T @ recomputed

    args = (torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 32), torch.randn(64, 32))
    gm = torch.fx.experimental.proxy_tensor.make_fx(backward)(*args)
    plan = fusion.plan(ir.from_fx(gm))
    saved = frozenset({plan.graph.inputs[0]})
    model = schedule._Model(plan, storages.Storages.of(plan), saved, [storages.uses(plan, s) for s in plan.steps])
    label = [schedule._label(s) for s in plan.steps]
    (recompute,) = [i for i, s in enumerate(plan.steps) if isinstance(s, fusion.Kernel) and saved & set(s.loads)]
    products = [i for i, name in enumerate(label) if name.startswith("extern mm")]
    assert model.floating[recompute] and not any(model.floating[i] for i in products)
    first, *_, reader = products  # the gradient's first product; the product that reads the recomputation
    assert model.greedy().index(recompute) < model.greedy().index(first)  # the plain rule: at once
    deferred = model.greedy(defer=True)
    assert max(deferred.index(i) for i in products[:-1]) < deferred.index(recompute) < deferred.index(reader)
    assert model.peak(deferred) < model.peak(model.greedy())


def test_the_model_claims_no_transposed_copy_written_over_its_source():
    # codegen/reuse.py never writes a store over a buffer the kernel reads at other addresses (an
    # attention's permuted copy of a matmul's result); the model must not count it as no memory
    def fn(x, w, w2):
        return ((x @ w).view(64, 6, 8).permute(1, 0, 2).contiguous() * 2).view(384, 8) @ w2

    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(64, 32), torch.randn(32, 48), torch.randn(8, 4))
    plan = fusion.plan(ir.from_fx(gm))
    kernels = [s for s in plan.steps if isinstance(s, fusion.Kernel)]
    shapes = storages.Storages.of(plan)
    assert kernels and all(schedule._written_over(plan, shapes, k) == {} for k in kernels)
    source = check(fn, torch.randn(64, 32), torch.randn(32, 48), torch.randn(8, 4))
    assert reused(source) == {}


def test_values_computed_from_computed_ones_stay_tied_by_a_small_shared_input():
    # RoPE's q and k share cos and sin (small inputs): one kernel, however large, whereas
    # recomputations from saved values alone are not tied by such an input (a mask every layer reads)
    def rope_like(x, wq, wk, cos):
        return (x @ wq) * cos, (x @ wk) * cos

    def recomputed(a, b, mask):
        return a * 2 * mask, b * 3 * mask

    big = 64 * 32 * 4
    with config.override(apart_bytes=big):
        gm = torch.fx.experimental.proxy_tensor.make_fx(rope_like)(
            torch.randn(64, 16), torch.randn(16, 32), torch.randn(16, 32), torch.randn(32)
        )
        assert len(fusion.plan(ir.from_fx(gm)).kernels) == 1
        gm = torch.fx.experimental.proxy_tensor.make_fx(recomputed)(
            torch.randn(64, 32), torch.randn(64, 32), torch.randn(32)
        )
        assert len(fusion.plan(ir.from_fx(gm)).kernels) == 2
