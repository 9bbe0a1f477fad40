"""What a graphed call's host time is made of, through torch's own API, the GPU held busy.

    PYTHONPATH=. python benchmarks/scripts/graph_pieces.py

Prints, in us per call: a storage over an address (`_construct_storage_from_data_pointer`), a
tensor on it (`_construct_CUDA_Tensor_From_Storage_And_Metadata`, or `empty(0).set_`), a clone, a
storage's use count (what runtime/graph_outputs.py does per output and call); then
`minicomp.jit` plain and graphed on `(x + y).relu()` (two inputs copied into the graph's buffers)
and on a function writing its one input in place (no copy); then cProfile's top functions of the
graphed call. The GPU only.
"""

import cProfile
import pstats
import time

import torch

import minicomp


def host_us(step, n=300, rounds=5):
    for _ in range(5):
        step()
    best = 1e9
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(5e8))
        start = time.perf_counter()
        for _ in range(n):
            step()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
        torch.cuda.synchronize()
    return best


def tiny(x, y):
    return (x + y).relu()


def decay(cache):
    cache.mul_(0.5)
    return cache.sum()


def main():
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    out = torch.randn(1024, device="cuda")
    storage = out.untyped_storage()
    ptr, nbytes, device = storage.data_ptr(), storage.nbytes(), out.device
    at = torch._C._construct_storage_from_data_pointer
    rows = {"storage from pointer": host_us(lambda: at(ptr, device, nbytes))}
    over = at(ptr, device, nbytes)
    rows["empty(0).set_"] = host_us(
        lambda: torch.empty(0, dtype=out.dtype, device=device).set_(over, 0, out.shape, out.stride())
    )
    meta = {"size": out.shape, "stride": out.stride(), "dtype": out.dtype, "storage_offset": 0}
    rows["construct_CUDA_Tensor"] = host_us(
        lambda: torch._C._construct_CUDA_Tensor_From_Storage_And_Metadata(meta, over)
    )
    rows["out.clone"] = host_us(lambda: out.clone())
    rows["storage use count"] = host_us(lambda: torch._C._storage_Use_Count(over._cdata))
    plain, graphed = minicomp.jit(tiny), minicomp.jit(tiny, cuda_graphs=True)
    rows["minicomp.jit, (x + y).relu()"] = host_us(lambda: plain(x, y))
    rows["minicomp.jit graphs, 2 inputs copied"] = host_us(lambda: graphed(x, y))
    cache = torch.randn(1024, device="cuda")
    plain_decay, graphed_decay = minicomp.jit(decay), minicomp.jit(decay, cuda_graphs=True)
    rows["minicomp.jit, written in place"] = host_us(lambda: plain_decay(cache))
    rows["minicomp.jit graphs, no copy"] = host_us(lambda: graphed_decay(cache))
    for name, us in rows.items():
        print(f"{name:40s} {us:7.2f} us")
    torch.cuda._sleep(int(2e9))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        graphed(x, y)
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
