"""`minicomp.jit(module)`: an nn.Module whose forward runs compiled.

The module's parameters and buffers are passed to the compiled function as
inputs (torch.func.functional_call), never baked in as constants: an optimizer
step is seen by the next call, and gradients reach the parameters through the
compiled backward.
"""
from __future__ import annotations

import torch
from torch.func import functional_call

from minicomp.api import JitFunction


class JitModule(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, fallback: str | None = None):
        super().__init__()
        self.module = module
        self.compiled = JitFunction(self._forward, fallback, name=type(module).__name__)

    def _forward(self, state, *args, **kwargs):
        return functional_call(self.module, state, args, kwargs)

    def forward(self, *args, **kwargs):
        state = dict(self.module.named_parameters())
        state.update(self.module.named_buffers())
        return self.compiled(state, *args, **kwargs)
