"""The launch spec of each kernel kind (runtime/launch_spec.py): its grid, its configuration
without measuring, its candidates, and a repr that reads as the line of generated code."""

import pytest
import torch

from minicomp import config
from minicomp.runtime import CombinedLaunch, PointwiseLaunch, ReductionLaunch, launch_configs

GPU, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(
    "spec, text",
    [
        (PointwiseLaunch(numel=4096), "PointwiseLaunch(numel=4096)"),
        (PointwiseLaunch(numel=4096, parts=2), "PointwiseLaunch(numel=4096, parts=2)"),
        (PointwiseLaunch(numel=600, planes=6, group=4), "PointwiseLaunch(numel=600, planes=6, group=4)"),
        (CombinedLaunch(pieces=(1024, 256)), "CombinedLaunch(pieces=(1024, 256))"),
        (CombinedLaunch(pieces=(8, 8), parts=2), "CombinedLaunch(pieces=(8, 8), parts=2)"),
        (ReductionLaunch(rows=8, rblock=64, extent=64), "ReductionLaunch(rows=8, rblock=64, extent=64)"),
        (ReductionLaunch(64, 64, 64, groups=4), "ReductionLaunch(rows=64, rblock=64, extent=64, groups=4)"),
    ],
)
def test_repr_is_the_expression_that_makes_the_spec(spec, text):
    """Fields at their defaults are left out; the text evaluates back to an equal spec."""
    assert repr(spec) == text
    namespace = {
        "PointwiseLaunch": PointwiseLaunch,
        "CombinedLaunch": CombinedLaunch,
        "ReductionLaunch": ReductionLaunch,
    }
    assert eval(text, namespace) == spec  # noqa: S307 - the text just checked


def test_pointwise_grid_and_heuristic():
    spec = PointwiseLaunch(numel=5000)
    assert spec.grid(1024) == 5 and spec.block_name == "BLOCK_SIZE" and spec.options == {}
    assert spec.heuristic(GPU) == launch_configs.heuristic(5000, GPU)
    assert spec.heuristic(CPU) == launch_configs.heuristic(5000, CPU)


def test_parts_scale_the_block_on_the_gpu_only():
    """Each offset writes `parts` elements: the GPU's block is divided by them, the interpreter's not."""
    spec = PointwiseLaunch(numel=1 << 20, parts=2)
    assert spec.heuristic(GPU) == (512, 4) and spec.heuristic(CPU) == launch_configs.heuristic(1 << 20, CPU)
    with config.override(launch_candidates=((512, 4), (2048, 8))):
        assert spec.candidates() == [(256, 4), (1024, 8)]


def test_a_small_kernel_spreads_over_programs_of_256_elements():
    """RoPE's q and k rotations in one decoding step (2 x 1024 elements, 2 parts, cos and sin each):
    one program of 2048 offsets took 4.0 us on an H200, 16 programs 1.0 us."""
    spec = CombinedLaunch(pieces=(1024, 1024), parts=2)
    block, warps = spec.heuristic(GPU)
    assert (block, warps) == (128, 4) and spec.grid(block) == 16
    assert launch_configs.heuristic(100, GPU) == (256, 4) and launch_configs.heuristic(8192, GPU) == (1024, 4)


def test_planes_pad_every_group_to_its_size():
    """6 planes walked 4 side by side: two groups of 4, each plane's blocks (90000 elements: 88 of 1024)."""
    assert PointwiseLaunch(numel=6 * 90000, planes=6, group=4).grid(1024) == 8 * 88


def test_a_combined_launch_runs_each_piece_after_the_other():
    spec = CombinedLaunch(pieces=(1000, 24))
    assert spec.numel == 1024 and spec.grid(512) == 2 + 1
    assert spec.heuristic(GPU) == launch_configs.heuristic(1024, GPU)


def test_reduction_grid_heuristic_and_options():
    spec = ReductionLaunch(rows=100, rblock=128, extent=100)
    assert spec.grid(8) == 13 and spec.block_name == "XBLOCK"
    assert spec.options == {"enable_fp_fusion": False}  # every op rounds, as in eager
    assert spec.heuristic(GPU) == launch_configs.reduction_heuristic(100, 128, GPU)
    assert spec.candidates() == launch_configs.reduction_candidates(100, 128)


def test_a_grouped_reduction_has_a_fixed_grid_and_chooses_for_its_group():
    spec = ReductionLaunch(rows=64, rblock=64, extent=64, groups=4)
    assert spec.grid(1) == spec.grid(16) == 4
    assert spec.heuristic(GPU) == launch_configs.reduction_heuristic(16, 64, GPU)


def test_tuned_counts_the_work_of_each_kind():
    with config.override(tune_min_numel=1 << 12):
        assert not PointwiseLaunch(numel=1 << 11).tuned()
        assert PointwiseLaunch(numel=1 << 11, parts=2).tuned()
        assert CombinedLaunch(pieces=(1 << 11, 1 << 11)).tuned()
        assert ReductionLaunch(rows=16, rblock=64, extent=256).tuned()  # 16 rows of 256
        assert not ReductionLaunch(rows=4, rblock=64, extent=64).tuned()
