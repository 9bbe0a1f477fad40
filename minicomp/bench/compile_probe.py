"""Run in a fresh process by the harness: time the first call of one compiled function.

    python -m minicomp.bench.compile_probe {minicomp|inductor} {cuda|cpu} [new-rows|new-seq]

Prints one number: seconds for the first call (trace + compile + run), with
whatever caches the environment points at (empty for "cold", filled for "warm").
With `new-rows`: seconds for the first call of bias + ReLU at a new row count
(2048 x 1024), after one call at 1024 x 1024 in the same process (a new batch size).
With `new-seq`: seconds for the first call of RoPE (q, k of [2, 8, S, 64]) at a
third sequence length, after calls at two others (minicomp's kernel family, or
Inductor's automatic dynamic shapes, has seen the size change).
"""

import sys
import time

import torch


def main() -> None:
    impl, device, mode = sys.argv[1], sys.argv[2], sys.argv[3:]
    from minicomp.workloads import bias_relu, rope

    fn = rope if mode == ["new-seq"] else bias_relu
    if impl == "minicomp":
        import minicomp

        fn = minicomp.jit(fn)
    else:
        fn = torch.compile(fn)

    def inputs(size):
        if mode == ["new-seq"]:
            return [torch.randn(2, 8, size, 64, device=device) for _ in range(2)] + [
                torch.randn(size, 64, device=device) for _ in range(2)
            ]
        return [torch.randn(size, 1024, device=device), torch.randn(1024, device=device)]

    earlier = {"new-rows": [1024], "new-seq": [256, 512]}.get(mode[0] if mode else "", [])
    for size in earlier:
        fn(*inputs(size))
    args = inputs(2048 if mode == ["new-rows"] else 1024)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{time.perf_counter() - start:.6f}")


if __name__ == "__main__":
    main()
