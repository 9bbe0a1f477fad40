"""Planes walked side by side for a large broadcast input (codegen/plane_order.py): when it applies,
and that the kernels it writes compute what eager does, a plane's last block partial, the group
of planes past the last plane masked off, pairs walked interleaved, a kernel family's sizes."""

import pytest
import torch
from conftest import check

import minicomp
from minicomp import config
from minicomp.codegen import plane_order
from minicomp.lowering.indexing import Dyn, Expr, Var
from minicomp.tools.workloads import rope, rope_gptj

# every broadcast input qualifies, 4 planes at a time (6 planes below: the second group is padded)
SIDE_BY_SIDE = dict(reuse_bytes=0, plane_group=4)


def mask_add(scores, additive):
    return scores + additive


def _launches(fn, *args):
    compiled = minicomp.jit(fn).compiled(*args)
    return [compiled.launch(call) for call in compiled.kernels]


def test_a_mask_over_batch_and_heads_walks_planes_side_by_side(device):
    """[2, 3, 300, 300] + [300, 300]: a plane of 90000 elements spans blocks on either device
    (the interpreter's blocks are at most 65536), its last one partial."""
    scores, mask = torch.randn(2, 3, 300, 300, device=device), torch.randn(300, 300, device=device)
    with config.override(**SIDE_BY_SIDE):
        source = check(mask_add, scores, mask, kernels=1)
        [launch] = _launches(mask_add, scores, mask)
    assert "programs walk 4 of its 6 planes (dims 0-1) side by side: additive read again by each" in source
    assert "plane = pid // (4 * blocks) * 4 + pid % 4" in source and "(plane < 6)" in source
    assert (launch.spec.planes, launch.spec.group) == (6, 4)
    assert launch.grid(1024) == 8 * 88  # two groups of 4 planes, 88 blocks of 1024 a plane


def test_a_mask_shared_by_heads_only_is_read_once_per_batch(device):
    """Hugging Face's additive mask [B, 1, S, S]: it varies along the batch, not the heads."""
    scores, mask = torch.randn(2, 3, 40, 50, device=device), torch.randn(2, 1, 40, 50, device=device)
    with config.override(**SIDE_BY_SIDE):
        source = check(mask_add, scores, mask, kernels=1)
    assert "4 of its 6 planes (dims 0-1) side by side" in source


@pytest.mark.parametrize("form, rotary", [(rope, 64), (rope_gptj, 32)])
def test_rope_walks_planes_side_by_side_and_matches_eager(device, form, rotary):
    """cos and sin [S, D] are read by every (batch, head) plane; GPT-J's pairs (`pairs`, `pair_mask`)
    follow the same plane order. S = 2200: a plane of 70400 elements a part (2 parts of 32)."""
    seq = 2200
    q, k = (torch.randn(2, 3, seq, 64, device=device) for _ in range(2))
    cos, sin = (torch.randn(seq, rotary, device=device) for _ in range(2))
    with config.override(**SIDE_BY_SIDE):
        source = check(form, q, k, cos, sin, kernels=1)
    assert "cos, sin read again by each" in source
    if form is rope_gptj:
        assert "pairs = 2 * (plane * 70400 + start)" in source and "tl.join(" in source


def test_a_kernel_family_keeps_the_plane_order_with_runtime_sizes(device):
    fn = minicomp.jit(mask_add)
    with config.override(**SIDE_BY_SIDE):
        for seq in (24, 40, 56):
            scores, mask = torch.randn(2, 3, seq, 32, device=device), torch.randn(seq, 32, device=device)
            torch.testing.assert_close(fn(scores, mask), scores + mask)
        source = fn.source(scores, mask)
    assert "runtime sizes" in source and "side by side" in source


def test_small_broadcast_inputs_keep_the_plain_order(device):
    """At the default threshold a bias or a short RoPE stays in L2: blocks walked in order."""
    x, b = torch.randn(64, 128, device=device), torch.randn(128, device=device)
    assert "side by side" not in check(lambda x, b: torch.relu(x + b), x, b, kernels=1)
    [launch] = _launches(mask_add, torch.randn(2, 3, 8, 8, device=device), torch.randn(8, 8, device=device))
    assert launch.spec.planes == 0


def test_an_expanded_input_counts_the_bytes_it_spans(device):
    """A bias passed expanded to [64, 1024] (stride 0) spans 4 KiB, not 256: 12 KiB between two
    reads of it, under a 64 KiB threshold, so the plain order; expanded to [64, 8192] it spans
    32 KiB beside 64 KiB a plane: over the threshold."""
    with config.override(reuse_bytes=64 << 10):
        for cols, side_by_side in ((1024, False), (8192, True)):
            x, b = torch.randn(64, cols, device=device), torch.randn(cols, device=device).expand(64, cols)
            fn = minicomp.jit(lambda x, b: torch.relu(x + b))
            torch.testing.assert_close(fn(x, b), torch.relu(x + b))
            source = fn.source(x, b)
            assert f"b: float32[64, {cols}] stride (0, 1)" in source
            assert ("side by side" in source) == side_by_side


def _rope_offsets(seq: int, head_dim: int = 64) -> dict:
    """The offsets minicomp's RoPE kernel loads (walked in 2 parts of head_dim): q and k at every
    element of [8, 32, S, head_dim], cos and sin at (s, d)."""
    x = [Expr.of(Var(d, n)) for d, n in enumerate((8, 32, seq, head_dim))]
    everywhere = x[0] * (32 * seq * 2 * head_dim) + x[1] * (seq * 2 * head_dim) + x[2] * (2 * head_dim) + x[3]
    by_position = x[2] * (2 * head_dim) + x[3]
    return {"q": {everywhere}, "k": {everywhere}, "cos": {by_position}, "sin": {by_position}}


@pytest.mark.parametrize(
    "seq, itemsize, chosen",
    [
        (8192, 4, True),  # 16 MiB a plane + 8 MiB of cos/sin between two reads: measured to miss L2
        (8192, 2, False),  # 8 + 4 MiB: measured to stay in L2
        (2048, 4, False),  # 4 + 2 MiB
    ],
)
def test_the_rule_follows_the_bytes_between_two_reads(seq, itemsize, chosen):
    """benchmarks/results/NVIDIA_H200/broadcast/: the cases measured on either side of the rule."""
    numel = 8 * 32 * seq * 128
    nbytes = {"q": numel * itemsize, "k": numel * itemsize, "cos": seq * 128 * itemsize, "sin": seq * 128 * itemsize}
    nbytes.update(out0=nbytes["q"], out1=nbytes["k"])
    order = plane_order.choose((8, 32, seq, 64), _rope_offsets(seq), nbytes)
    assert (order is not None) == chosen
    if chosen:
        assert (order.dims, order.planes, order.group, order.reused) == (2, 256, 32, ("cos", "sin"))
        assert order.reuse_bytes == 24 << 20


def test_a_gathered_index_or_a_scalar_is_not_a_broadcast_input():
    """A gather's index may land anywhere: nothing is known to repeat; a scalar (None) is no plane's."""
    x = [Expr.of(Var(d, n)) for d, n in enumerate((64, 1 << 20))]
    gathered = {Expr.of(Dyn("idx", 1 << 20))}
    offsets = {"x": {x[0] * (1 << 20) + x[1]}, "table": gathered, "scale": {None}}
    nbytes = {"x": 1 << 28, "table": 1 << 22, "scale": 4, "out": 1 << 28}
    with config.override(reuse_bytes=0):
        assert plane_order.choose((64, 1 << 20), offsets, nbytes) is None
