"""A language model's vocabulary projection and loss, trained, with and without padded matmuls.

    python -m benchmarks.experiments.padded_matmuls OUT.json

`F.cross_entropy(F.linear(h, W).float(), y)` forward + backward, bf16, h [8192, 1024]: GPT-2's
vocabulary (50257), BERT's (30522) and an aligned one (32000) as the control. Eager, Inductor,
minicomp with config pad_matmuls="never" and "auto" (plan/pad_matmuls.py), side by side in one
process: median ms of a step, the CUDA kernels a step launches (torch.profiler) and the peak
memory above the inputs. Issue #38: unpadded, the projection and both its gradients run on
cuBLAS's align1 kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import minicomp
from benchmarks.experiments import harness
from minicomp import config

VOCABULARIES = (50257, 30522, 32000)
MIB = 2**20


def loss(h, w, y):
    return F.cross_entropy(F.linear(h, w).float(), y)


def inputs(run: harness.Run, vocab: int) -> list:
    rows, width = (16, 24) if run.tiny else (8192, 1024)
    vocab = vocab if not run.tiny else vocab % 61 + 3
    dtype = torch.float32 if run.tiny else torch.bfloat16
    h = torch.randn(rows, width, device=run.device, dtype=dtype, requires_grad=True)
    w = (torch.randn(vocab, width, device=run.device, dtype=dtype) * width**-0.5).requires_grad_()
    return [h, w, torch.randint(0, vocab, (rows,), device=run.device)]


def step_of(fn):
    def step(h, w, y):
        fn(h, w, y).backward()

    return step


def kernels_and_peak(run: harness.Run, step, args) -> tuple[int | None, float | None, list]:
    """(CUDA kernels a step launches, peak MiB above the inputs, the 6 kernels of most time: name, ms)."""
    if run.tiny:
        return None, None, []
    step(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(*args)
        torch.cuda.synchronize()
    cuda = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sum(e.count for e in cuda)
    top = sorted(cuda, key=lambda e: -e.device_time_total)[:6]
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(*args)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    return kernels, peak, [(e.key[:90], round(e.device_time_total / 1e3, 3)) for e in top]


def main(argv=None):
    run = harness.parse(argv, __doc__)
    rows = []
    for vocab in VOCABULARIES:
        args = inputs(run, vocab)
        variants = {"eager": loss}
        if not run.tiny:
            variants["inductor"] = torch.compile(loss, dynamic=False)  # static, as minicomp: each vocabulary its own
        for mode in ("never", "auto") if not run.tiny else ("never", "always"):
            with config.override(pad_matmuls=mode):
                fn = minicomp.jit(loss)
                step_of(fn)(*args)  # compiles forward and backward under this mode
            variants[f"minicomp pad={mode}"] = fn
        for name, fn in variants.items():
            step = step_of(fn)
            ms = run.bench(step, [args])
            kernels, peak, top = kernels_and_peak(run, step, args)
            row = dict(vocab=vocab, variant=name, ms=ms, kernels=kernels, peak_mib=peak, top_kernels=top)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            rows.append(row)
    run.write(rows=rows, shape="h [8192, 1024] bf16, W [V, 1024]")


if __name__ == "__main__":
    main()
