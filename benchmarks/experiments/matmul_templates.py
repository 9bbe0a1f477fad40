"""Matmul templates with their epilogues (issue #40) against cuBLAS + a fused epilogue kernel.

    python -m benchmarks.experiments.matmul_templates OUT.json

bf16 on the GPU, side by side in one process: eager, Inductor (torch.compile's default),
minicomp with MINICOMP_MATMUL=template (each matmul a Triton template, its bias, activation
and residual in the store: plan/matmul.py), =library (cuBLAS, then one fused pointwise kernel)
and =auto (the shape rule). Workloads:

  dlrm_<K>x<N>   one DLRM MLP layer, relu(x @ W^T + b), x [8192, K]
  mlp3_128       three layers of width 128 with ReLU, x [8192, 128] (one kernel: a chain)
  mlp2_64        two layers of width 64 with ReLU, x [8192, 64] (one kernel: a chain)
  mlp3_128_b64k, mlp2_64_b64k   the same at x [65536, width]: GPU-bound, not host-bound
  swiglu_1024x2816   silu(x @ w1) * (x @ w3), x [8192, 1024]: one kernel (x @ w1 a sibling)
  gemm_4096      x @ W, [4096, 4096] @ [4096, 4096], no epilogue
  gemm_4096_bias_relu   the same with bias + ReLU
  lora_r16       x @ W + 2 * (x @ A) @ B, x [8192, 1024], W [1024, 1024], rank 16 (one kernel:
                 x @ W a sibling, x @ A chained)

and, as training steps (forward + backward: the backward's dx and dW matmuls are templates
too), `train_dlrm_512x256` and `train_mlp3_128`.

Each row: median ms (do_bench), the relative error against a float32 eager reference, the
kernels minicomp's (forward) module launches and their kinds, the first call's seconds (trace,
compile, tuning, and in "auto" the timing of the choice), and ms / the library variant's ms
(`x_library`: under 1 is the template winning) and / eager's. The MLP rows add "minicomp
template, layer by layer": a template a layer, the chain off (config matmul_chain_width=0); the
SwiGLU and LoRA rows "minicomp template, siblings" (config matmul_siblings: one kernel).
MATMUL_AUTOTUNE=1 adds Inductor with mode="max-autotune-no-cudagraphs" (its GEMM templates timed,
minutes of compile: its first_s is the
comparison of compile cost); MATMUL_AUTOTUNE=name,name adds it to those workloads only.
MATMUL_WORKLOADS=name,name runs only those.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

import minicomp
from benchmarks.experiments import harness
from minicomp import config

MODES = ("template", "library", "auto")


def layer(x, w, b):
    return torch.relu(F.linear(x, w, b))


def mlp3(x, w1, b1, w2, b2, w3, b3):
    return torch.relu(F.linear(torch.relu(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)), w3, b3))


def mlp2(x, w1, b1, w2, b2):
    return torch.relu(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2))


def swiglu(x, w1, w3):
    return F.silu(x @ w1) * (x @ w3)


def gemm(x, w):
    return x @ w


def gemm_bias_relu(x, w, b):
    return torch.relu(x @ w + b)


def lora(x, w, a, b):
    return x @ w + 2.0 * ((x @ a) @ b)


def workloads(run: harness.Run) -> dict:
    """name -> (fn, make(dtype) -> args)."""
    s = 16 if run.tiny else 1  # tiny: every size divided by 16 (rank kept at 16, width >= 16)
    rows = 8192 // s // (4 if run.tiny else 1)
    dev = run.device

    def randn(*shape, dtype, scale=1.0):
        return torch.randn(*shape, device=dev, dtype=dtype) * scale

    found = {}
    for k, n in ((512, 512), (512, 256), (256, 128), (1024, 1024)):
        found[f"dlrm_{k}x{n}"] = (
            layer,
            lambda dtype, k=k // s, n=n // s: [
                randn(rows, k, dtype=dtype),
                randn(n, k, dtype=dtype, scale=k**-0.5),
                randn(n, dtype=dtype),
            ],
        )
    mlps = (("mlp3_128", mlp3, 3, max(128 // s, 16), rows), ("mlp2_64", mlp2, 2, max(64 // s, 16), rows))
    mlps += tuple((f"{name}_b64k", fn, depth, width, rows * 8) for name, fn, depth, width, rows in mlps)
    for name, fn, depth, width, batch in mlps:
        found[name] = (
            fn,
            lambda dtype, depth=depth, width=width, batch=batch: (
                [randn(batch, width, dtype=dtype)]
                + [
                    t
                    for _ in range(depth)
                    for t in (randn(width, width, dtype=dtype, scale=width**-0.5), randn(width, dtype=dtype))
                ]
            ),
        )
    d, hidden = 1024 // s, 2816 // s
    found["swiglu_1024x2816"] = (
        swiglu,
        lambda dtype: [randn(rows, d, dtype=dtype)] + [randn(d, hidden, dtype=dtype, scale=d**-0.5) for _ in range(2)],
    )
    big = 4096 // s
    found["gemm_4096"] = (
        gemm,
        lambda dtype: [randn(big, big, dtype=dtype), randn(big, big, dtype=dtype, scale=big**-0.5)],
    )
    found["gemm_4096_bias_relu"] = (
        gemm_bias_relu,
        lambda dtype: [
            randn(big, big, dtype=dtype),
            randn(big, big, dtype=dtype, scale=big**-0.5),
            randn(big, dtype=dtype),
        ],
    )
    d = 1024 // s
    found["lora_r16"] = (
        lora,
        lambda dtype: [
            randn(rows, d, dtype=dtype),
            randn(d, d, dtype=dtype, scale=d**-0.5),
            randn(d, 16, dtype=dtype, scale=d**-0.5),
            randn(16, d, dtype=dtype, scale=0.25),
        ],
    )
    for name in ("dlrm_512x256", "mlp3_128", "mlp2_64"):
        fn, make = found[name]
        found[f"train_{name}"] = (
            fn,
            lambda dtype, make=make: [a.requires_grad_(i > 0) for i, a in enumerate(make(dtype))],
        )
    return found


def step(fn, train: bool):
    """fn itself, or for training a forward + backward with a fixed seed gradient."""
    if not train:
        return fn

    def run(*args):
        out = fn(*args)
        out.backward(torch.ones_like(out))
        return out

    return run


def first_call_s(fn, args) -> float:
    start = time.perf_counter()
    fn(*args)
    if torch.cuda.is_available() and args[0].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None):
    run = harness.parse(argv, __doc__)
    dtype = torch.float32 if run.tiny else torch.bfloat16
    harness.fresh_cache()  # nothing tuned or compiled by an earlier run
    rows = []
    only = [n for n in os.environ.get("MATMUL_WORKLOADS", "").split(",") if n]
    for name, (fn, make) in workloads(run).items():
        if only and name not in only:
            continue
        train = name.startswith("train_")
        args = make(dtype)
        with torch.no_grad():
            reference = fn(*[a.detach().float() for a in args])
        variants = {"eager": (fn, None)}
        if not run.tiny:
            variants["inductor"] = (torch.compile(fn, dynamic=False), None)
            autotune = os.environ.get("MATMUL_AUTOTUNE", "")
            if autotune == "1" or name in autotune.split(","):
                variants["inductor max-autotune"] = (
                    torch.compile(fn, dynamic=False, mode="max-autotune-no-cudagraphs"),
                    None,
                )
        for mode in MODES:
            with config.override(matmul=mode):
                variants[f"minicomp {mode}"] = (minicomp.jit(fn), mode)
        settings = {variant: {"matmul": mode} for variant, (_, mode) in variants.items() if mode}
        if "mlp" in name:
            variants["minicomp template, layer by layer"] = (minicomp.jit(fn), "template")
            settings["minicomp template, layer by layer"] = {"matmul": "template", "matmul_chain_width": 0}
        if name.startswith(("swiglu", "lora")):
            variants["minicomp template, siblings"] = (minicomp.jit(fn), "template")
            settings["minicomp template, siblings"] = {"matmul": "template", "matmul_siblings": True}
        results = {}
        for variant, (compiled, mode) in variants.items():
            go = step(compiled, train)
            with config.override(**settings.get(variant, {})):
                first = first_call_s(go, args)
                out = go(*args)
                kinds = None
                if mode:
                    entry = compiled.entry(*args)
                    forward = getattr(entry, "forward", None) or entry.compiled  # (a training entry's, or the one)
                    kinds = [k.kind for k in forward.kernels]
            for a in args:
                a.grad = None
            ms = run.bench(go, [args])
            results[variant] = ms
            rows.append(
                dict(
                    workload=name,
                    variant=variant,
                    ms=ms,
                    err=harness.relative_error(out.detach().float(), reference.float()),
                    kernels=None if kinds is None else len(kinds),
                    kinds=kinds,
                    first_s=first,
                    shapes=[list(a.shape) for a in args],
                )
            )
        for row in rows:
            if row["workload"] == name:
                row["x_library"] = row["ms"] / results["minicomp library"]
                row["x_eager"] = row["ms"] / results["eager"]
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    run.write(rows=rows, dtype=str(dtype), modes=list(MODES))


if __name__ == "__main__":
    main()
