"""Run RoPE forward + backward (bf16, q, k of [8, 32, 2048, 128]) a few times, for a profiler to watch.

    ncu --kernel-name regex:mc_fused --launch-skip 20 --launch-count 2 python benchmarks/experiments/rope_ncu_probe.py

(rope_ncu.txt was taken before codegen/split.py, of the masked kernels; this now runs the split ones.)
"""
import torch

import minicomp
from minicomp.workloads import WORKLOADS, rope

inputs = WORKLOADS["rope_fwbw"].make(2048, torch.bfloat16, "cuda")
fn = minicomp.jit(rope)
grads = [torch.randn_like(inputs[0]), torch.randn_like(inputs[1])]
for _ in range(20):
    torch.autograd.backward(fn(*inputs), grads)
    for t in inputs[:2]:
        t.grad = None
torch.cuda.synchronize()
