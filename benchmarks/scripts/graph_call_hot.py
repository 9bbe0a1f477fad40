"""A graphed `minicomp.jit` call's host time and its pieces (issue #39: the hot path).

    PYTHONPATH=. python benchmarks/scripts/graph_call_hot.py

`(x + y).relu()` on 1024 float32 elements with `cuda_graphs=True`, after 5 calls: the host µs of
the whole call, of torch's `CUDAGraph.replay()` alone, of the record's replay (the outputs handed
out), of the hand-out alone (a new storage each call), and of the hot path's call
(dispatch/hot_path.py): each warmed by 200 calls, then timed in 5 rounds, the pieces taking turns
within a round, with the GPU held busy by a sleep (step_host_time.py's method); printed: the least
of the rounds, and each round. The GPU only.
"""

import torch

import minicomp
from benchmarks.experiments.step_host_time import host_and_gpu_us

ROUNDS = 5


def f(x, y):
    return (x + y).relu()


def main() -> None:
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    jitted = minicomp.jit(f, cuda_graphs=True)
    for _ in range(5):
        jitted(x, y)
    torch.cuda.synchronize()
    record = next(iter(jitted.graphs.kept.values()))[1]
    plan = record.plan  # (hand_out: a new storage each call, nothing handed out before)
    pieces = {
        "graphed call": lambda: jitted(x, y),
        "graph.replay": record.graph.replay,
        "record.replay": lambda: record.replay(None),
        "hand_out": lambda: plan.hand_out(plan.ready([]), record.outputs, None),
    }
    hot = getattr(jitted, "_hot", None)
    if hot is not None:
        pieces["hot call"] = lambda: hot.call((x, y), None)
    for step in pieces.values():  # warm: the first timed piece of a process read 1.7x its later rounds
        for _ in range(200):
            step()
    torch.cuda.synchronize()
    rounds = {name: [] for name in pieces}
    for _ in range(ROUNDS):  # the pieces take turns within each round
        for name, step in pieces.items():
            rounds[name].append(host_and_gpu_us(step, False)[0])
    for name, times in rounds.items():
        print(name, round(min(times), 2), "(rounds: " + ", ".join(f"{t:.2f}" for t in times) + ")")


if __name__ == "__main__":
    main()
