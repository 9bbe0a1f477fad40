"""Run in a fresh process by the harness: time the first call of one compiled function.

    python -m minicomp.bench.compile_probe {minicomp|inductor} {cuda|cpu}

Prints one number: seconds for the first call (trace + compile + run), with
whatever caches the environment points at (empty for "cold", filled for "warm").
"""
import sys
import time

import torch


def main() -> None:
    impl, device = sys.argv[1], sys.argv[2]
    from minicomp.bench.workloads import bias_relu

    x, b = torch.randn(1024, 1024, device=device), torch.randn(1024, device=device)
    if impl == "minicomp":
        import minicomp
        fn = minicomp.jit(bias_relu)
    else:
        fn = torch.compile(bias_relu)
    start = time.perf_counter()
    fn(x, b)
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{time.perf_counter() - start:.6f}")


if __name__ == "__main__":
    main()
