"""Bias + GELU, LoRA's add-mul-ReLU and SwiGLU: each one fused kernel; training works too.

python examples/fused_epilogues.py
"""

import torch
import torch.nn.functional as F

import minicomp


@minicomp.jit
def bias_gelu(x, b):
    y = x + b
    return 0.5 * y * (1 + torch.tanh(0.7978845608 * (y + 0.044715 * y**3)))


@minicomp.jit
def lora_epilogue(x, y, b):
    return torch.relu(x + 0.5 * y + b)


@minicomp.jit
def swiglu(g, u):
    return F.silu(g) * u


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.randn(64, 256, device=device), torch.randn(64, 256, device=device)
    b = torch.randn(256, device=device)
    torch.testing.assert_close(lora_epilogue(x, y, b), torch.relu(x + 0.5 * y + b))
    print(bias_gelu.source(x, b).split("@triton.jit")[1].split("def call")[0])
    g = torch.randn(64, 256, device=device, requires_grad=True)
    swiglu(g, y).sum().backward()  # the backward is compiled and fused too
    print(
        "d/dg of sum(silu(g) * u) ok:",
        torch.allclose(g.grad, (torch.sigmoid(g) * (1 + g * (1 - torch.sigmoid(g))) * y).detach(), atol=1e-5),
    )
