"""A training step's peak memory, by the line that allocated each block alive at the peak.

    PYTHONPATH=. python benchmarks/scripts/peak_snapshot.py MODEL VARIANT

MODEL: a key of minicomp/bench/model_specs.MODELS; VARIANT: as in minicomp/bench/model_row.py
(`inductor`, `minicomp`, `minicomp:chunk_budget_bytes=268435456`). Prints the peak
above what was allocated before the step, then the blocks alive at the peak grouped by the line of
the generated module (or library) that allocated them, largest first (env TOP: how many groups,
14 by default). The GPU only.
"""

import importlib
import linecache
import os
import sys
import tempfile

import torch

from minicomp.bench import model_row
from minicomp.bench import model_specs as ms

KEEP = ("minicomp_cache", "/tmp", "torchinductor", "minicomp/dispatch", "_functorch", "modules/", "transformers")


def where(event) -> str:
    """The first frame of interest of an allocation, with its line of source."""
    for frame in event.get("frames", []):
        name = frame["filename"]
        if any(k in name for k in KEEP):
            text = linecache.getline(name, frame["line"]).strip()[:90]
            return f"{name.split('/')[-1]}:{frame['line']} {frame['name']} | {text}"
    return "?"


def main(name: str, variant: str) -> None:
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())
    spec = ms.MODELS[name]
    sizes = spec.sizes(False)
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "train", "cuda", torch.bfloat16)
    bf16 = torch.bfloat16
    args, kwargs, target = ms.step_inputs(spec, sizes, "train", task, sizes.length, "cuda", bf16, bf16)
    compiled = model_row.compiled(task, variant)

    def step():
        compiled(*args, target=target, **kwargs).backward()
        task.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(name, variant, "peak MiB above", round((torch.cuda.max_memory_allocated() - base) / 2**20, 1))
    live, total, best, at = {}, 0, -1, {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
        elif event["action"] == "free_requested" and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
        if total > best:
            best, at = total, dict(live)
    groups: dict[str, list[int]] = {}
    for event in at.values():
        group = groups.setdefault(where(event), [0, 0])
        group[0] += event["size"]
        group[1] += 1
    for line, (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: int(os.environ.get("TOP", 14))]:
        print(f"  {size / 2**20:8.1f} MiB in {count:3d} blocks  {line}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
