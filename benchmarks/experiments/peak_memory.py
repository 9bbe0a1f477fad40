"""What is alive at the peak of the decoder block's training step: minicomp against Inductor.

    python -m benchmarks.experiments.peak_memory OUT.json

Runs the bench's `llama_block_fwbw` step (forward, then backward with ones; bf16, B=4, S=2048,
d=2048, 4 k/v heads) through `minicomp.jit` (what the bench times), minicomp's Dynamo backend
and Inductor. After a warm-up step, one step runs under CUDA's allocator history
(`torch.cuda.memory._record_memory_history`, Python stacks); `live_at_peak` replays its
allocations and frees, finds the moment the most memory was allocated and lists what was alive
then, each with the innermost frames of the code that allocated it (the line of a generated
module names the buffer). Issue #16 asks for peak memory at or below Inductor's; the saved
tensors are the same bytes (saved_tensors.py), so the difference is in these lists.
With --tiny (CPU) the step runs but there is no allocator history: the lists are empty.
"""

from __future__ import annotations

import linecache

import torch

import minicomp
import minicomp.dispatch.dynamo
from benchmarks.experiments import harness
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS, llama_block

MIB = 2**20
FRAMES = 4  # innermost frames kept for each allocation


def live_at_peak(events: list[dict]) -> tuple[int, list[dict]]:
    """(peak bytes, allocations alive then) from an allocator trace: a list of events with
    `action` ("alloc", "free_requested", ...), `addr`, `size` and `frames`. Bytes count from the
    trace's start (what was allocated before it is not in it)."""
    live: dict[int, dict] = {}
    now = peak = 0
    at_peak: list[dict] = []
    for event in events:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            now += event["size"]
            if now > peak:
                peak, at_peak = now, list(live.values())
        elif event["action"] == "free_requested" and event["addr"] in live:
            now -= live.pop(event["addr"])["size"]
    return peak, sorted(at_peak, key=lambda e: -e["size"])


def _where(frames: list[dict]) -> list[str]:
    """The innermost frames outside torch's own Python, as `file:line name | source line`."""
    kept = []
    for frame in frames:
        name = frame["filename"]
        if "/torch/" in name and "torchinductor" not in name:
            continue
        source = linecache.getline(name, frame["line"]).strip()
        kept.append(f"{name.rsplit('/', 1)[-1]}:{frame['line']} {frame['name']} | {source}")
        if len(kept) == FRAMES:
            break
    return kept


def profile(step) -> dict:
    step()  # warm-up: compiles, tunes, fills the caching allocator
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for e in snapshot["device_traces"][torch.cuda.current_device()] if "addr" in e]
    peak, alive = live_at_peak(events)
    return dict(
        peak_mib=peak / MIB,
        alive=[dict(mib=e["size"] / MIB, where=_where(e.get("frames", []))) for e in alive],
    )


def main(argv=None):
    run = harness.parse(argv, __doc__)
    seq, dtype = (8, torch.float32) if run.tiny else (2048, torch.bfloat16)
    workload = WORKLOADS["llama_block_fwbw"]
    inputs = [i.detach().requires_grad_(i.requires_grad) for i in workload.make(seq, dtype, torch.device(run.device))]
    impls = [("minicomp.jit", lambda: minicomp.jit(llama_block))]
    if not run.tiny:  # (Inductor's CPU compile of the block takes minutes)
        impls += [
            ("minicomp dynamo", lambda: torch.compile(llama_block, backend=minicomp.dispatch.dynamo.backend)),
            ("inductor", lambda: torch.compile(llama_block)),
        ]
    rows = []
    for name, make in impls:
        torch._dynamo.reset()
        fn = make()

        def step():
            outs = measure.flat_tensors(fn(*inputs))
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            del outs
            for i in inputs:
                i.grad = None

        row = dict(impl=name, peak_mib=None, alive=[]) if run.tiny else dict(impl=name, **profile(step))
        if run.tiny:
            step()
        rows.append(row)
        print(name, row["peak_mib"], flush=True)
        for alive in row["alive"][:25]:
            print(f"  {alive['mib']:8.1f} MiB", *alive["where"][:2], sep="\n      ")
    run.write(rows=rows)


if __name__ == "__main__":
    main()
