"""Issue #41's loss at one budget, in one process, for an A/B of two trees (run it from each).

    PYTHONPATH=. python benchmarks/scripts/chunked_loss_ab.py NAME BUDGET_MIB

bf16 h [8192, 4096], W [128256, 4096], y with every 17th row ignored; forward + backward of
`F.cross_entropy((h @ W.T).float(), y)` (NAME containing "smooth": label smoothing 0.1) through
the minicomp backend at config "chunk_budget_bytes" = BUDGET_MIB (NAME containing "ind":
Inductor). Prints the median step (10, CUDA events), the peak memory above the inputs
(gradients included), the loss's error against float32 eager, and one step's GPU time by kind:
Triton kernels (the chunks' joint kernels), matmuls, the rest.
"""

import collections
import os
import statistics
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import minicomp.dispatch.dynamo  # noqa: E402
from minicomp import config  # noqa: E402
from minicomp.bench import measure  # noqa: E402


def loss(h, W, y):
    return F.cross_entropy((h @ W.T).float(), y)


def smoothed(h, W, y):
    return F.cross_entropy((h @ W.T).float(), y, label_smoothing=0.1)


def _kind(name: str) -> str:
    if name.startswith(("mc_", "triton")):
        return "triton"
    return "matmul" if any(word in name for word in ("gemm", "nvjet", "cutlass")) else "other"


def main(name: str, budget_mib: int) -> None:
    n, d, v = 8192, 4096, 128256
    torch.manual_seed(0)
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    W = (torch.randn(v, d, device="cuda") / d**0.5).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda")
    y[::17] = -100
    plain = smoothed if "smooth" in name else loss
    with config.override(chunk_budget_bytes=budget_mib << 20):
        fn = torch.compile(plain) if "ind" in name else torch.compile(plain, backend=minicomp.dispatch.dynamo.backend)

        def step():
            return torch.autograd.grad(fn(h, W, y), [h, W])

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
        for begin, end in events:
            begin.record()
            step()
            end.record()
        torch.cuda.synchronize()
        ms = statistics.median(begin.elapsed_time(end) for begin, end in events)
        peak = measure.peak_bytes(fn, [h, W, y], backward=True) / 2**20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        error = abs(fn(h, W, y).item() - plain(h.float(), W.float(), y).item())
    gpu_ms, count = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            gpu_ms[_kind(event.name)] += event.device_time_total / 1e3
            count[_kind(event.name)] += 1
    grads = 2 * (h.numel() + W.numel()) / 2**20
    print(
        f"{name} budget {budget_mib} MiB: {ms:.2f} ms, peak {peak:.0f} MiB (grads {grads:.0f}), loss err {error:.2e};"
        " GPU ms by kind: " + ", ".join(f"{k} {gpu_ms[k]:.2f} ({count[k]})" for k in gpu_ms),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
