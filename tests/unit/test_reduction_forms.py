"""Which form a row reduction takes (reduction_space.reduction_form) and what the looped form
does with the row it reads twice (codegen/reduction.py): rows over config "persistent_bytes"
of their widest input loop, their first pass keeping the row in L2 for the second; a kernel
that takes row groups stays persistent; an online max loads the lanes past the row as -inf.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import check, grads_match, kernel_text

import minicomp
from minicomp import config
from minicomp.plan.reduction_space import ReductionSpace, can_take_row_groups, reduction_form, row_itemsize
from minicomp.tools.workloads import cross_entropy, rms_norm, softmax


def forms(source: str) -> list[str]:
    """Each reduction kernel's form, from the kernel headers of a module."""
    return re.findall(r"^#   reduction \((\w+)", source, flags=re.M)


def loads(text: str, buffer: str) -> list[str]:
    """The `tl.load(<buffer>_ptr ...)` calls of a kernel's text, in order."""
    return re.findall(rf"tl\.load\({buffer}_ptr [^\n]*", text)


def test_rows_of_more_than_persistent_bytes_loop_and_are_read_again_from_l2(device):
    x, w = torch.randn(6, 1024, device=device), torch.randn(1024, device=device)  # 4 KB rows
    source = check(rms_norm, x, w, kernels=1)
    (kernel,) = kernel_text(source)
    assert forms(source) == ["looped"] and kernel.count("for roffset") == 2
    first, second = loads(kernel, "x")
    assert "evict_last" in first and "evict_first" in second  # kept for pass 2, let go there
    assert "evict_last" in loads(kernel, "w")[0]  # the weight: read by every row


def test_short_rows_are_held_whole_without_hints(device):
    x, w = torch.randn(6, 128, device=device), torch.randn(128, device=device)  # 512 bytes
    source = check(rms_norm, x, w, kernels=1)
    assert forms(source) == ["persistent"] and "eviction_policy" not in source


def test_a_single_pass_loop_gets_no_hints(device):
    """A looped sum reads each element once: nothing to keep in L2."""
    x = torch.randint(-8, 8, (4, 1024), device=device).float()  # whole numbers: sums exact in any order
    source = check(lambda x: x.sum(-1), x, kernels=1)
    assert forms(source) == ["looped"] and "eviction_policy" not in source


def test_row_bytes_count_the_input_not_its_float32_upcast(device):
    """Hugging Face's RMSNorm reduces x.float() ** 2: a bfloat16 row of 512 is 1 KB, held whole."""
    x, w = torch.randn(6, 512, dtype=torch.bfloat16, device=device), torch.randn(512, device=device)
    assert forms(check(rms_norm, x, w.bfloat16(), kernels=1)) == ["persistent"]
    assert forms(check(rms_norm, x.float(), w, kernels=1)) == ["looped"]


def test_row_itemsize_walks_pointwise_producers_to_the_inputs():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    graph = minicomp.jit(lambda x: (x.float() * 2).pow(2).sum(-1)).compiled(x).plan.graph
    (summed,) = [n for n in graph.order if graph[n].op_name == "sum"]
    source = graph[summed].inputs()[0]
    assert graph[source].meta.dtype == torch.float32 and row_itemsize(graph, source) == 2


def test_reduction_form_by_elements_and_bytes():
    space = ReductionSpace((32, 4096), (1,), torch.device("cpu"))
    assert reduction_form(space, itemsize=4) == (True, 4096, False)
    assert reduction_form(space, itemsize=4, takes_row_groups=True) == (False, 4096, False)
    with config.override(persistent_bytes=1 << 20):
        assert reduction_form(space, itemsize=4) == (False, 4096, False)
    short = ReductionSpace((32, 1000), (1,), torch.device("cpu"))
    assert reduction_form(short, itemsize=2) == (True, 1024, False)  # one step: RBLOCK no wider than the row
    long_rows = ReductionSpace((32, 16384), (1,), torch.device("cpu"))
    assert can_take_row_groups(space) and not can_take_row_groups(long_rows)


def test_a_kernel_taking_row_groups_stays_persistent(device):
    """The RMSNorm backward's dx kernel carries the dW partials of its row groups; only a
    persistent kernel walks its rows in groups, so it is held whole although 4 KB a row."""
    x, w = torch.randn(64, 1024, device=device), torch.randn(1024, device=device)
    entry = grads_match(rms_norm, x, w)
    assert forms(entry.forward.source) == ["looped"]
    assert "partial column results of" in entry.backward.source
    assert forms(entry.backward.source)[0] == "persistent"  # dx, with the dW partials


def test_online_max_loads_past_the_row_as_minus_inf(device):
    logits = torch.randn(5, 1000, device=device) * 4  # 1000: the last block is partly past the row
    logits[1] = float("-inf")
    logits[2, 7] = float("nan")
    logits[3, 999] = float("inf")
    y = torch.tensor([1, 2, 3, 4, 999], device=device)
    source = check(lambda a, b: F.cross_entropy(a, b, reduction="none"), logits, y, kernels=1)
    assert 'other=float("-inf")' in source and "tl.where(rmask, logits" not in source
    check(cross_entropy, logits[[0, 4]], y[[0, 4]], kernels=2)
    for fn in (softmax, lambda x: torch.logsumexp(x, -1)):
        check(fn, logits)


def test_online_sum_with_terms_below_float32_normals(device):
    """exp(x - max) under 2**-126 may be flushed to 0 by the online sum's exp2 (on the GPU):
    a sum that holds exp(max - max) = 1 loses such terms anyway."""
    x = torch.full((3, 2048), -100.0, device=device)
    x[:, 0] = 0.0
    x[1, 1:] = -87.0  # exp(-87) ~ 1.6e-38: just above the smallest normal float32
    x[2, 1:] = -120.0
    with config.override(loop_block=512):
        for fn in (softmax, lambda x: torch.logsumexp(x, -1), lambda x: torch.log_softmax(x, -1)):
            check(fn, x)


@pytest.mark.parametrize("extent", [1000, 1003, 1024 + 517])
def test_a_looped_row_of_an_odd_length_takes_its_last_step_apart(device, extent):
    """Under `rindex < 1003` the compiler can prove no two neighbouring lanes share a mask value, so
    every step loaded element by element (4.5x a copy's time on an H200, 1.2x peeled). A row whose
    length is no multiple of 8 loops over its whole steps unmasked, then takes the partial one;
    softmax and cross-entropy (forward and backward) stay eager's."""
    x = torch.randn(6, extent, device=device)
    t = torch.randint(0, extent, (6,), device=device)
    with config.override(loop_block=512):
        source = check(softmax, x)
        grads_match(cross_entropy, x, t, grad_of=[0])
    peeled = "(whole steps)" in source
    assert peeled == bool(extent % 8), source
    if peeled:
        assert f"roffset = {extent} // RBLOCK * RBLOCK" in source
