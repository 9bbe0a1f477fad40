"""The seed workloads, written as a user would write them (shared with `minicomp bench`)."""

import torch.nn.functional as F

from minicomp.tools.workloads import bias_relu, gelu_tanh, lora_epilogue, rope, rotate_half, swiglu  # noqa: F401


def gelu_erf(x):  # the bench's gelu_erf adds a bias first; the tests want the plain op
    return F.gelu(x)
