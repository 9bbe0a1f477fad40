"""Run in a fresh process by the harness: time the first call of one compiled function.

    python -m minicomp.bench.compile_probe {minicomp|inductor} {cuda|cpu} [new-rows]

Prints one number: seconds for the first call (trace + compile + run), with
whatever caches the environment points at (empty for "cold", filled for "warm").
With `new-rows`: seconds for the first call at a new row count (2048 x 1024),
after one call at 1024 x 1024 in the same process (a new batch size).
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
    if sys.argv[3:] == ["new-rows"]:
        fn(x, b)
        x = torch.randn(2048, 1024, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
    start = time.perf_counter()
    fn(x, b)
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{time.perf_counter() - start:.6f}")


if __name__ == "__main__":
    main()
