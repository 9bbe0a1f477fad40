"""A graphed `minicomp.jit` call's host time and its pieces (issue #39: the hot path).

    PYTHONPATH=. python benchmarks/scripts/graph_call_hot.py

`(x + y).relu()` on 1024 float32 elements with `cuda_graphs=True`, after 5 calls: the host µs of
the whole call, of torch's `CUDAGraph.replay()` alone, of the record's replay (the outputs handed
out), of the hand-out alone (a new storage each call), and of the hot path's call
(dispatch/hot_path.py), each the least of 3 rounds with the GPU held busy by a sleep
(step_host_time.py's method). The GPU only.
"""

import torch

import minicomp
from benchmarks.experiments.step_host_time import host_and_gpu_us


def f(x, y):
    return (x + y).relu()


def host_us(step) -> float:
    return round(min(host_and_gpu_us(step, False)[0] for _ in range(3)), 2)


def main() -> None:
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    jitted = minicomp.jit(f, cuda_graphs=True)
    for _ in range(5):
        jitted(x, y)
    torch.cuda.synchronize()
    record = next(iter(jitted.graphs.kept.values()))[1]
    print("graphed call", host_us(lambda: jitted(x, y)))
    print("graph.replay", host_us(record.graph.replay))
    print("record.replay", host_us(lambda: record.replay(None)))
    plan = record.plan  # (a new storage each call: nothing handed out before)
    print("hand_out", host_us(lambda: plan.hand_out(plan.ready([]), record.outputs, None)))
    hot = getattr(jitted, "_hot", None)
    if hot is not None:
        print("hot call", host_us(lambda: hot((x, y), None)))


if __name__ == "__main__":
    main()
