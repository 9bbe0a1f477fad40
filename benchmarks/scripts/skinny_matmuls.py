"""One row @ W.T (a decoding step's projections of Llama d2048 and GPT-2 d1024), bf16: cuBLAS and
an epilogue against the matmul template at each of its skinny tiles (launch_spec.SKINNY_TILES),
timed as MINICOMP_MATMUL=auto times them (runtime/matmul_choice.py), beside the time the weight's
bytes take at 4.8 TB/s.

    PYTHONPATH=. python benchmarks/scripts/skinny_matmuls.py

The GPU only."""

import torch

from minicomp.runtime import matmul_choice

SHAPES = {  # (k, n) of each projection
    "llama": [(2048, 2048), (2048, 512), (2048, 5632), (5632, 2048), (2048, 32000)],
    "gpt2": [(1024, 3072), (1024, 1024), (1024, 4096), (4096, 1024), (1024, 50257)],
}


def main():
    device = torch.device("cuda")
    for model, pairs in SHAPES.items():
        for k, n in pairs:
            a, b = ((1, k), (k, 1)), ((k, n), (1, k))  # x and W.T as nn.Linear reads them
            library = matmul_choice._time_library(torch.bfloat16, device, a, b, (1, n))
            tiles = matmul_choice._time_template(torch.bfloat16, device, a, b)
            best = min(tiles, key=tiles.get)
            floor_us = k * n * 2 / 4.8e12 * 1e6
            each = {str(t[:3]): round(ms * 1e3, 1) for t, ms in tiles.items()}
            print(
                f"{model} k={k} n={n}: cuBLAS+relu {library * 1e3:.1f} us, template best {tiles[best] * 1e3:.1f} us "
                f"{best}, weight-read floor {floor_us:.1f} us; {each}"
            )


if __name__ == "__main__":
    main()
