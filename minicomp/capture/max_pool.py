"""Max pooling as ops minicomp fuses, its positions kept as one byte a window.

    max_pool2d_with_indices(x [N, C, H, W], k, s, p, d)  -> (values, indices int64) [N, C, OH, OW]
 -> x padded with -inf; for each of the KH * KW window offsets, the strided slice of it
    [N, C, OH, OW] that offset reads; values and the offset (int8) of each window's maximum by a
    running comparison; indices = where that offset lies in x (h * W + w), from the offset.

One pointwise kernel reads x once a window offset and writes values and offsets. What a training
step saves for the backward (max_pool2d_with_indices_backward reads the int64 indices) is then
the min-cut partition's choice: the offsets (one byte each) with the indices recomputed from them
in the backward, where ATen's kernel saved them as eight bytes each. A ResNet-50 batch of 64 holds
its first pool's indices, [64, 64, 56, 56]: 98 MiB as int64, 12 as offsets (Inductor's
`_low_memory_max_pool2d_with_offsets` does the same).

Eager's tie and NaN rules are kept: the first maximum of a window (row by row) wins, a NaN wins
over any number and a later NaN over an earlier one, and a window whose values are all -inf
points at its first element inside x. Floating dtypes, windows of at most MAX_WINDOW elements
(a larger window would be that many loads a value); anything else stays ATen's op.
"""

from __future__ import annotations

import torch

MAX_WINDOW = 25  # KH * KW above this: ATen's kernel (Inductor's limit too)


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The decomposition (module docstring); NotImplemented keeps ATen's op."""
    from torch._meta_registrations import pooling_output_shape

    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel_size), _pair(padding), _pair(dilation)
    sh, sw = _pair(stride) if stride else (kh, kw)
    if not x.dtype.is_floating_point or x.ndim not in (3, 4) or kh * kw > MAX_WINDOW:
        return NotImplemented
    height, width = x.shape[-2:]
    oh = pooling_output_shape(height, kh, ph, sh, dh, ceil_mode)
    ow = pooling_output_shape(width, kw, pw, sw, dw, ceil_mode)
    if oh <= 0 or ow <= 0 or ph > kh // 2 or pw > kw // 2:
        return NotImplemented  # ATen's op raises its own error
    below = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - ph - height)  # -inf rows after x for the last window
    right = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - pw - width)
    padded = torch.constant_pad_nd(x, [pw, right, ph, below], float("-inf"))
    best, offset = None, None
    for k in range(kh * kw):
        a, b = divmod(k, kw)
        rows = padded[..., a * dh : a * dh + sh * (oh - 1) + 1 : sh, :]
        value = rows[..., b * dw : b * dw + sw * (ow - 1) + 1 : sw]
        if best is None:
            best, offset = value, torch.zeros_like(value, dtype=torch.int8)
            continue
        take = (value > best) | torch.isnan(value)
        best = torch.where(take, value, best)
        offset = torch.where(take, torch.full_like(offset, k), offset)
    # a window whose values are all -inf (or whose first offset lies in the padding and none
    # beats it) points at its first element inside x, as eager's does
    first = _first_inside(oh, ow, (kh, kw), (sh, sw), (ph, pw), (dh, dw), x.device)
    offset = torch.where((offset == 0) & (best == float("-inf")), first.to(torch.int8), offset)
    return best, offsets_to_indices(offset, (oh, ow), kw, (sh, sw), (ph, pw), (dh, dw), width)


def offsets_to_indices(offset, out_size, kw: int, stride, padding, dilation, width: int):
    """Where each window's maximum lies in its [H, W] plane (h * W + w, int64), from its offset
    (row-major in a window `kw` wide)."""
    (oh, ow), (sh, sw), (ph, pw), (dh, dw) = out_size, stride, padding, dilation
    k = offset.to(torch.int64)
    rows = torch.arange(oh, device=offset.device).view(oh, 1) * sh - ph
    cols = torch.arange(ow, device=offset.device) * sw - pw
    return (rows + torch.div(k, kw, rounding_mode="floor") * dh) * width + cols + (k % kw) * dw


def _first_inside(oh: int, ow: int, kernel, stride, padding, dilation, device):
    """[OH, OW]: the offset of each window's first element inside x (the padding skipped)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    top = torch.arange(oh, device=device) * sh - ph  # the window's first row, maybe in the padding
    left = torch.arange(ow, device=device) * sw - pw
    a = torch.clamp(torch.div(dh - 1 - top, dh, rounding_mode="floor"), min=0, max=kh - 1)
    b = torch.clamp(torch.div(dw - 1 - left, dw, rounding_mode="floor"), min=0, max=kw - 1)
    return a.view(oh, 1) * kw + b
