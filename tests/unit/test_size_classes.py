"""Size classes (runtime/size_classes.py): a measurement made at one size serves the sizes of its
class, so a new sequence length or batch size times nothing (issue #42)."""

from __future__ import annotations

import pytest
import torch

from minicomp.runtime import matmul_timing
from minicomp.runtime.size_classes import bucket, layout_class


@pytest.mark.parametrize("n, cls", [(0, 0), (1, 1), (2, 2), (3, 4), (4088, 4096), (4096, 4096), (4097, 8192)])
def test_a_size_class_is_the_next_power_of_two(n, cls):
    assert bucket(n) == cls


def test_a_layout_class_keeps_what_cublas_chooses_by():
    rows = layout_class(((4088, 1024), (1024, 1)))
    assert rows == layout_class(((4000, 1024), (1024, 1)))  # another length, one class
    assert rows != layout_class(((4088, 1024), (1, 4088)))  # transposed: another order
    assert layout_class(((1024, 50257), (50257, 1))) != layout_class(((1024, 50257), (50264, 1)))  # 1- vs 8-aligned
    assert layout_class(((4, 1022), (1022, 1)))[2] == (2, 1)  # a row stride of 1022 is 2-aligned
    assert layout_class(((4, 1024), (1024, 1)))[2] == (16, 1)


@pytest.fixture
def timed_matmuls(monkeypatch, tmp_path):
    """padding_pays without a GPU: each timing is counted; a product whose N is 8-aligned takes
    1 ms, else 2 (cuBLAS's align1 kernels), a pad nothing."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    runs = []
    monkeypatch.setattr(matmul_timing, "_matmul", lambda op, dtype, device, layouts: ("mm", layouts))
    monkeypatch.setattr(matmul_timing, "_pad", lambda dtype, device, layout: ("pad", layout))

    def median_ms(run) -> float:
        runs.append(run)
        return 0.0 if run[0] == "pad" else 1.0 if run[1][1][0][1] % 8 == 0 else 2.0

    monkeypatch.setattr(matmul_timing, "_median_ms", median_ms)
    return runs


def _gpt2_head(rows: int, vocab: int) -> tuple:
    plain = (((rows, 1024), (1024, 1)), ((1024, vocab), (1, 1024)))
    padded = (((rows, 1024), (1024, 1)), ((1024, vocab + (-vocab) % 8), (1, 1024)))
    return plain, padded


def test_padding_is_measured_once_per_class_of_shapes(timed_matmuls):
    device = torch.device("cuda")
    plain, padded = _gpt2_head(4092, 50257)
    with pytest.MonkeyPatch.context() as m:  # the padded side slower: not padded
        slower = lambda run: timed_matmuls.append(run) or (2.0 if run[1] == padded else 1.0)  # noqa: E731
        m.setattr(matmul_timing, "_median_ms", slower)
        assert not matmul_timing.padding_pays("mm", torch.bfloat16, device, plain, padded, [])
    measured = len(timed_matmuls)
    assert measured > 0
    plain, padded = _gpt2_head(4088, 50257)  # a new length, one class: remembered
    assert not matmul_timing.padding_pays("mm", torch.bfloat16, device, plain, padded, [])
    assert len(timed_matmuls) == measured
    plain, padded = _gpt2_head(8200, 50257)  # another class: measured (the stand-in says padded wins)
    assert matmul_timing.padding_pays("mm", torch.bfloat16, device, plain, padded, [])
    assert len(timed_matmuls) > measured


def test_a_decisive_first_round_ends_the_measurement(timed_matmuls):
    """An align1 product twice its padded form's time (or more) is decided by one round of timing
    (plain, padded, each pad); a close call is timed ROUNDS times, alternating."""
    device = torch.device("cuda")
    plain, padded = _gpt2_head(4092, 50257)  # the stand-in: 2 ms plain, 1 ms padded
    assert matmul_timing.padding_pays("mm", torch.bfloat16, device, plain, padded, [plain[1]])
    assert [run[0] for run in timed_matmuls] == ["mm", "mm", "pad"]
    timed_matmuls.clear()
    with pytest.MonkeyPatch.context() as m:  # 1.0 against 0.9 ms: not decisive, every round
        close = lambda run: timed_matmuls.append(run) or (0.9 if run[1] == padded else 1.0)  # noqa: E731
        m.setattr(matmul_timing, "_median_ms", close)
        plain, padded = _gpt2_head(8200, 50257)
        assert matmul_timing.padding_pays("mm", torch.bfloat16, device, plain, padded, [])
    assert len(timed_matmuls) == 2 * matmul_timing.ROUNDS
