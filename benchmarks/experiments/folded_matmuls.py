"""Folded matmul kernels (issue #40): a chain (an MLP whose hidden widths fit on chip, one kernel)
and siblings (a template computing the other products its epilogue reads) against a template per
matmul and against cuBLAS + a fused epilogue kernel.

    python -m benchmarks.experiments.folded_matmuls OUT.json

bf16 on the GPU, each variant compiled in a fresh cache with every call under its setting:
"library" (MINICOMP_MATMUL=library), "template a matmul" (template, config matmul_chain_width=0
and matmul_siblings off) and "template folded" (template, matmul_siblings on, the chain width
the default). Each row: the GPU time a call (torch.profiler's CUDA time summed over 50 calls,
warm L2: the kernels alone, not the host), the launches a call and the relative error against
float32 eager. Workloads: ReLU MLPs of 3 layers at width 128 (8192 and 65536 rows), 2 at width
64 (both), 3 at width 256 (65536: over the default chain width, forced here); SwiGLU at
[8192, 1024] x [1024, 2816]; a rank-16 LoRA linear at [8192, 1024] x [1024, 1024].
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.nn.functional as F

import minicomp
from benchmarks.experiments import harness
from minicomp import config


def mlp(x, *params):
    for w, b in zip(params[::2], params[1::2]):
        x = torch.relu(F.linear(x, w, b))
    return x


def swiglu(x, w1, w3):
    return F.silu(x @ w1) * (x @ w3)


def lora(x, w, a, b):
    return x @ w + 2.0 * ((x @ a) @ b)


VARIANTS = {
    "library": dict(matmul="library"),
    "template a matmul": dict(matmul="template", matmul_chain_width=0, matmul_siblings=False),
    "template folded": dict(matmul="template", matmul_siblings=True),
}


def cases(run: harness.Run) -> dict:
    """name -> (fn, args, extra settings of the folded variant)."""
    s = 16 if run.tiny else 1

    def r(*shape, scale=1.0):
        return torch.randn(*shape, device=run.device, dtype=torch.float32 if run.tiny else torch.bfloat16) * scale

    def mlp_args(rows, width, depth):
        width = max(width // s, 16)
        return [r(rows // s, width)] + [t for _ in range(depth) for t in (r(width, width, scale=width**-0.5), r(width))]

    d, hidden = 1024 // s, 2816 // s
    return {
        "mlp3_128 8k": (mlp, mlp_args(8192, 128, 3), {}),
        "mlp3_128 64k": (mlp, mlp_args(65536, 128, 3), {}),
        "mlp2_64 8k": (mlp, mlp_args(8192, 64, 2), {}),
        "mlp2_64 64k": (mlp, mlp_args(65536, 64, 2), {}),
        "mlp3_256 64k": (mlp, mlp_args(65536, 256, 3), {"matmul_chain_width": 256}),
        "swiglu": (swiglu, [r(8192 // s, d), r(d, hidden, scale=d**-0.5), r(d, hidden, scale=d**-0.5)], {}),
        "lora r16": (
            lora,
            [r(8192 // s, d), r(d, d, scale=d**-0.5), r(d, 16, scale=d**-0.5), r(16, d, scale=0.25)],
            {},
        ),
    }


def gpu_us(fn, args, calls: int = 50) -> tuple[float, float]:
    """(CUDA µs a call, kernel launches a call) of `fn(*args)`, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return sum(e.device_time_total for e in events) / calls, sum(e.count for e in events) / calls


def main(argv=None):
    run = harness.parse(argv, __doc__)
    rows = []
    for name, (fn, args, extra) in cases(run).items():
        with torch.no_grad():
            reference = fn(*[a.float() for a in args])
        times = {}
        for variant, settings in VARIANTS.items():
            os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()  # compiled under this setting alone
            with config.override(**settings, **(extra if variant == "template folded" else {})):
                compiled = minicomp.jit(fn)
                out = compiled(*args)
                us, launches = gpu_us(compiled, args) if not run.tiny else (run.bench(compiled, [args]) * 1e3, None)
                kinds = [k.kind for k in compiled.entry(*args).compiled.kernels]
            times[variant] = us
            row = dict(case=name, variant=variant, us=us, launches=launches, kernels=kinds)
            row["err"] = harness.relative_error(out.float(), reference.float())
            rows.append(row)
        for row in rows[-len(VARIANTS) :]:
            row["x_template_a_matmul"] = row["us"] / times["template a matmul"]
            row["x_library"] = row["us"] / times["library"]
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    run.write(rows=rows, variants=VARIANTS)


if __name__ == "__main__":
    main()
