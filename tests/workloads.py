"""The seed workloads, written as a user would write them (no minicomp in sight)."""
import torch
import torch.nn.functional as F


def gelu_tanh(x, b):  # seed 002: bias + GELU, tanh form written out
    y = x + b
    return 0.5 * y * (1 + torch.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))


def gelu_erf(x):
    return F.gelu(x)


def bias_relu(x, b):
    return torch.relu(x + b)


def lora_epilogue(x, y, b):  # seed 004: add-mul-ReLU
    return torch.relu(x + 0.5 * y + b)


def swiglu(g, u):
    return F.silu(g) * u


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
