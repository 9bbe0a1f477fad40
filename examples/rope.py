"""Rotary position embedding, written the plain PyTorch way, compiled by minicomp.

    python examples/rope.py        (CPU: Triton's interpreter; GPU when present)

q and k are rotated in ONE kernel: rotate_half's slices and cat become loads
of q at shifted offsets, and because the cat's boundary cuts the head dim in
two equal halves the kernel walks it half by half, each half's choice decided
in its own lines (every element of q, k, cos and sin loaded once, no selects).
cos/sin are read at a broadcast index.
"""

import torch

import minicomp


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@minicomp.jit
def rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, H, S, D = 2, 4, 16, 64
    q, k = torch.randn(B, H, S, D, device=device), torch.randn(B, H, S, D, device=device)
    cos, sin = torch.randn(S, D, device=device), torch.randn(S, D, device=device)
    oq, ok = rope(q, k, cos, sin)
    torch.testing.assert_close(oq, q * cos + rotate_half(q) * sin)
    torch.testing.assert_close(ok, k * cos + rotate_half(k) * sin)
    print(rope.source(q, k, cos, sin))
