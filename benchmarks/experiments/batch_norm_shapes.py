"""Batch norm + ReLU, training forward and backward, at ResNet-50's shapes: GPU time per step.

    python -m benchmarks.experiments.batch_norm_shapes OUT.json
    TRITON_INTERPRET=1 python -m benchmarks.experiments.batch_norm_shapes OUT.json --tiny

Each shape [N, C, H, W] is channels_last bfloat16, as ResNet-50's training step at batch 64 has
them (issue #38): `relu(batch_norm(x, ..., training=True))`, then its backward. For eager,
Inductor (torch.compile's default) and minicomp (backend="minicomp"), a row gives `gpu_us`, the
sum of the GPU activities of one step (torch.profiler, the mean of 5 steps after 3 warm-up
steps), and `top`, its 4 longest kernels; `floor_us` is 7 passes over x's bytes (the forward
reads x twice and writes y; the backward reads the gradient, x and the mask and writes the
input's gradient) at the measured copy bandwidth. What the statistics' split does at 64 channels
(N alone gave 64 partials: 64 programs) is the row to watch (plan/split_reductions.py).
`--tiny` runs eager and minicomp on one small shape on the CPU and checks minicomp's gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from benchmarks.experiments import harness
from minicomp.dispatch.dynamo import registered

SHAPES = [(64, 64, 112, 112), (64, 64, 56, 56), (64, 256, 56, 56), (64, 128, 28, 28), (64, 512, 28, 28)]
SHAPES += [(64, 256, 14, 14), (64, 1024, 14, 14), (64, 2048, 7, 7)]
WARMUP, STEPS = 3, 5


def bn_relu(x, w, b, mean, var):
    return F.relu(F.batch_norm(x, mean, var, w, b, training=True))


def _inputs(shape, device, dtype):
    c = shape[1]
    x = torch.randn(shape, device=device, dtype=dtype).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(c, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(c, device=device, dtype=dtype, requires_grad=True)
    stats = torch.zeros(c, device=device, dtype=dtype), torch.ones(c, device=device, dtype=dtype)
    return x, w, b, *stats


def _step(fn, inputs, grad):
    x, w, b, mean, var = inputs
    fn(x, w, b, mean, var).backward(grad)
    grads = x.grad, w.grad, b.grad
    x.grad = w.grad = b.grad = None
    return grads


def _gpu_us(fn, inputs, grad) -> tuple[float, list[str]]:
    for _ in range(WARMUP):
        _step(fn, inputs, grad)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            _step(fn, inputs, grad)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:4]
    return (
        sum(e.self_device_time_total for e in events) / STEPS,
        [f"{e.key[:70]} {e.self_device_time_total / STEPS:.1f} us" for e in top],
    )


def main(argv=None):
    run = harness.parse(argv, __doc__)
    for name in ("recompile_limit", "cache_size_limit"):  # one code object, compiled per shape and backend
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    torch.manual_seed(0)
    dtype = torch.float32 if run.tiny else torch.bfloat16
    shapes = [(4, 8, 6, 6)] if run.tiny else SHAPES
    variants = {"eager": bn_relu, "minicomp": torch.compile(bn_relu, backend=registered())}
    if not run.tiny:
        variants["inductor"] = torch.compile(bn_relu)
    bandwidth = run.bandwidth()
    rows = []
    for shape in shapes:
        inputs = _inputs(shape, run.device, dtype)
        grad = torch.randn_like(inputs[0])
        floor_us = 7 * inputs[0].numel() * inputs[0].element_size() / bandwidth * 1e6
        for name, fn in variants.items():
            row = dict(shape=list(shape), variant=name, floor_us=floor_us)
            if run.tiny:
                got = _step(fn, inputs, grad)
                want = _step(bn_relu, _inputs_like(inputs), grad)
                row["max_grad_error"] = max((g - w).abs().max().item() for g, w in zip(got, want))
            else:
                row["gpu_us"], row["top"] = _gpu_us(fn, inputs, grad)
            rows.append(row)
            print(shape, name, {k: v for k, v in row.items() if k not in ("shape", "variant")}, flush=True)
    run.write(rows=rows)


def _inputs_like(inputs):
    x, w, b, mean, var = inputs
    return (
        x.detach().clone().requires_grad_(),
        w.detach().clone().requires_grad_(),
        b.detach().clone().requires_grad_(),
        torch.zeros_like(mean),
        torch.ones_like(var),
    )


if __name__ == "__main__":
    main()
