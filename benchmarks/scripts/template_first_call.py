"""A LoRA linear as matmul templates (`relu(x @ W.T + b + (x @ A.T) @ B.T)`, bf16, 8192 rows):
its cold first call in this fresh process, and how many of this process's Triton compiles found
their binary in Triton's cache (a compile worker's) or compiled (issue #40; the GPU only).

    [MINICOMP_COMPILE_PROCESSES=0] MINICOMP_LOGS=cache PYTHONPATH=. python benchmarks/scripts/template_first_call.py
"""

import os
import tempfile
import time

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402
from triton import knobs  # noqa: E402

import minicomp  # noqa: E402
from minicomp import config  # noqa: E402


def lora(x, w, b, a, bb):
    return torch.relu(x @ w.T + b + (x @ a.T) @ bb.T)


def main() -> None:
    found: list[bool] = []
    knobs.compilation.listener = lambda **kw: found.append(kw["cache_hit"])
    shapes = [(8192, 512), (256, 512), (256,), (16, 512), (256, 16)]
    args = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    with config.override(matmul="template"):
        fn = minicomp.jit(lora)
        start = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        print("first", time.perf_counter() - start)
    print("this process's Triton compiles: cache hits", found.count(True), "compiled", found.count(False))


if __name__ == "__main__":
    main()
