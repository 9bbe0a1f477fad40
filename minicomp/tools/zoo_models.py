"""The model zoo's registry: tiny random configs of real architectures (`minicomp zoo`, zoo.py).

Each entry builds a model and its inputs from a seeded generator, in float32 on the CPU: 1-2
layers, hidden sizes of 16-64, a vocabulary of 128, no dropout (every config field named
`*drop*` is 0, every `nn.Dropout` has p=0), so eager and compiled runs see the same function.
Sources: transformers (the `zoo` extra), timm and torchvision (where they import: a source that
does not import is skipped, not failed).

Inputs are well conditioned: float64 eager must agree with float32 eager (zoo_run.py measures it
per run and reports it as `fp32_vs_fp64`). The one choice that needs care is batch norm in
training mode: it normalizes by the batch's statistics, and over few values float32 rounding
decides the result. Measured (float32 eager against float64 eager, largest error relative to the
tensor's magnitude): RegNet on 2 images of 8x8 (1x1 maps at the last stage) is off by 0.8, on 2
of 16x16 by 2e-6. The transformers CNNs take 2 images of 32x32 (at least 2x2x2 values per channel
at the last stage; 1e-6, up to 5e-4 for MobileNetV2's second training step), the timm and
torchvision ones, which downsample by 32, 4 images of 64x64.
"""

from __future__ import annotations

from minicomp.tools.zoo_builders import Spec
from minicomp.tools.zoo_transformers import TRANSFORMERS
from minicomp.tools.zoo_vision import VISION_LIBRARIES

__all__ = ["FAST", "MODELS", "Spec"]

MODELS = {spec.name: spec for spec in TRANSFORMERS + VISION_LIBRARIES}
# A handful of small, quick ones for CI: an encoder, a decoder, a CNN with batch norm, a state-space model.
FAST = ["bert", "llama", "resnet", "mamba"]
