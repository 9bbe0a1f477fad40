"""A dim walked in interleaved parts (codegen/parts.py), pairs loaded and stored whole
(codegen/pointwise.py): GPT-J's rotary and strided slices, against eager."""

import pytest
import torch
from conftest import check

import minicomp
from minicomp.tools.workloads import rope_gptj


def _gptj_inputs(device, dtype, seq=5, transposed=False):
    def heads(n):
        if transposed:  # views of a [B, S, H, D] projection, as a model's q and k are
            return torch.randn(2, seq, n, 16, device=device, dtype=dtype).transpose(1, 2)
        return torch.randn(2, n, seq, 16, device=device, dtype=dtype)

    cos, sin = (torch.randn(seq, 8, device=device, dtype=dtype) for _ in range(2))
    return [heads(3), heads(3), cos, sin]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_gptj_rotary_loads_each_pair_once(device, dtype, transposed):
    """(x[2i], x[2i+1]) -> (-x[2i+1], x[2i]): each part's parity is decided in its text, q and k
    are read by one contiguous load a pair and written by one store (the walk follows the
    output's layout, which is q's, so pairs are adjacent either way)."""
    source = check(rope_gptj, *_gptj_inputs(device, dtype, transposed=transposed), kernels=1)
    assert "interleaved parts" in source
    for buffer in ("q", "k"):
        assert f"tl.split(tl.reshape(tl.load({buffer}_ptr + pairs, mask=pair_mask" in source
    assert source.count("tl.store(") == 2 and "tl.join(" in source
    assert "% 2)" not in source  # no parity left to test at run time


def test_gptj_rotary_backward_writes_pairs(device):
    inputs = [t.requires_grad_(i < 2) for i, t in enumerate(_gptj_inputs(device, torch.float32, seq=7))]
    eager = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    fn = minicomp.jit(rope_gptj, fallback="raise")
    outs = fn(*inputs)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)
    torch.autograd.backward(rope_gptj(*eager), grads)
    for got, want in zip(inputs[:2], eager[:2]):
        torch.testing.assert_close(got.grad, want.grad)
    backward = fn.entry(*inputs).backward.source
    assert "interleaved parts" in backward and "tl.load(tangents_1_ptr + pairs" in backward
    assert "% 2 == 0" not in backward  # the strided slice_scatters are decided per part


def test_an_input_laid_out_unlike_the_walk_is_read_element_by_element(device):
    """q as the first 16 of 32 columns: a pair's address is not twice the walk's flat index, so q
    is read with a load per part; the output, laid out like the walk, is still stored in pairs."""
    q, k, cos, sin = _gptj_inputs(device, torch.float32)
    wide = torch.randn(*q.shape[:-1], 32, device=device)
    source = check(lambda w, k, c, s: rope_gptj(w[..., :16], k, c, s), wide, k, cos, sin, kernels=1)
    assert "w_ptr + pairs" not in source and "k_ptr + pairs" in source
    assert "tl.store(out0_ptr + pairs" in source


def test_two_tensors_interleaved(device):
    x, y = torch.randn(3, 5, 6, device=device), torch.randn(3, 5, 6, device=device)
    source = check(lambda x, y: torch.stack((x * 2, y.exp()), -1).flatten(-2), x, y, kernels=1)
    assert "interleaved parts" in source and "tl.store(out_ptr + pairs" in source
    assert "x_ptr + pairs" not in source  # x is only ever the even element: read as it is laid out


@pytest.mark.parametrize(
    "width, start, step",
    [(12, 1, 2), (12, 0, 2), (12, 1, 3), (12, 2, 4), (7, 0, 2), (9, 1, 2), (10, 1, 5)],
)
def test_strided_slice_scatter_in_parts_or_masked(device, width, start, step):
    """A step that divides the dim (and at most config max_parts): interleaved parts, else the
    masked walk (7 and 9 columns, or a step of 5); the same values either way. (Regression:
    torch.slice_scatter's default end, None, was read as 0, so `src` was never written.)"""
    x = torch.randn(4, width, device=device)
    y = torch.randn(4, len(range(start, width, step)), device=device)
    source = check(lambda x, y: torch.slice_scatter(x * 2, y + 1, -1, start, None, step), x, y, kernels=1)
    assert ("interleaved parts" in source) == (width % step == 0 and step <= 4)


def test_a_pair_is_read_whole_only_where_both_elements_are(device):
    """x's even columns beside z: x's odd columns are never loaded, so x is not read in pairs
    (with 7 columns its last pair would run past the row)."""
    x, z = torch.randn(3, 7, device=device), torch.randn(3, 4, device=device)
    source = check(lambda x, z: torch.stack((x[:, ::2], z), -1).flatten(-2) + 1, x, z, kernels=1)
    assert "x_ptr + pairs" not in source


def test_a_partial_last_block_of_pairs(device):
    """More pairs than one program takes and not a multiple of its block: the pair mask."""
    q, k, cos, sin = _gptj_inputs(device, torch.float32, seq=37)
    check(rope_gptj, q, k, cos, sin, kernels=1)
