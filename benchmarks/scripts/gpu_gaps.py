"""Where a suite model's GPU waits inside back-to-back steps, and for what (issues #38, #39).

    PYTHONPATH=. python benchmarks/scripts/gpu_gaps.py MODEL STEP BACKEND [OUT_DIR]

MODEL: a key of minicomp/bench/model_specs.MODELS; STEP: train, infer, decode, decode-static;
BACKEND: eager, inductor, inductor-ro, minicomp, minicomp-graphs (minicomp/bench/model_row.py).
After 8 warm steps, 6 steps run back to back under torch.profiler (CPU and CUDA), synchronized
only after the last, as a training loop runs. The first and last steps are dropped. Printed:
- the window's wall time a step, the GPU's busy time a step, and its idle time a step;
- the idle time by what the GPU waited for: each gap between two GPU activities is put on the
  host calls (ATen ops, CUDA runtime calls) that started between the two activities' launches,
  by the op whose time there was longest (`(python)` where no op ran: the wrapper's own Python);
- the 12 longest gaps with the kernels on either side;
- the 25 GPU activities with the most time a step (us, count a step, name).
The chrome trace is written to OUT_DIR/MODEL_STEP_BACKEND.json.gz when OUT_DIR is given.
"""

import collections
import gzip
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())


from minicomp.bench import model_row  # noqa: E402

STEPS = 6
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def main(name: str, step: str, variant: str, out: str | None) -> None:
    prof = model_row.profiled(model_row.real_step(name, step, variant), STEPS, each_synchronized=False)
    trace = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    report(name, step, variant, events)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(trace, "rb") as src, gzip.open(os.path.join(out, f"{name}_{step}_{variant}.json.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)


def report(name: str, step: str, variant: str, events: list[dict]) -> None:
    steps = sorted((e for e in events if e["name"] == "one_step" and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])  # fmt: skip
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}  # fmt: skip
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    host = sorted((e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")),
                  key=lambda e: e["ts"])  # fmt: skip
    # the GPU activities launched by steps 1 .. STEPS-2, in the order they ran
    begin, end = steps[1]["ts"], steps[-2]["ts"] + steps[-2]["dur"]
    ran = [g for g in gpu if begin <= launches.get(g["args"].get("correlation"), {"ts": -1})["ts"] <= end]
    n = len(steps) - 2
    busy = sum(g["dur"] for g in ran)
    window = ran[-1]["ts"] + ran[-1]["dur"] - ran[0]["ts"]
    by_cause, gaps = collections.Counter(), []
    for prev, nxt in zip(ran, ran[1:]):
        idle = nxt["ts"] - (prev["ts"] + prev["dur"])
        if idle <= 1.0:
            continue
        a = launches[prev["args"]["correlation"]]["ts"]
        b = launches[nxt["args"]["correlation"]]["ts"]
        spent = collections.Counter()
        for h in host:
            if a < h["ts"] < b:
                spent[h["name"]] += min(h["dur"], b - h["ts"])
        cause = spent.most_common(1)[0][0] if spent else "(python)"
        by_cause[cause] += idle
        gaps.append((idle, prev["name"][:60], nxt["name"][:60], cause))
    print(f"== {name} {step} {variant}: {n} steps, window {window / n / 1e3:.3f} ms a step, "
          f"GPU busy {busy / n / 1e3:.3f} ms, idle {(window - busy) / n / 1e3:.3f} ms, "
          f"{len(ran) / n:.0f} GPU activities a step")  # fmt: skip
    print("  idle us a step by the host call between the launches (longest there):")
    for cause, us in by_cause.most_common(15):
        print(f"    {us / n:9.1f}  {cause[:90]}")
    print("  longest gaps (us, before, after, host call):")
    for idle, prev, nxt, cause in sorted(gaps, reverse=True)[:12]:
        print(f"    {idle:8.1f}  {prev:60s} -> {nxt:60s} [{cause[:50]}]")
    time, count = collections.Counter(), collections.Counter()
    for g in ran:
        time[g["name"]] += g["dur"]
        count[g["name"]] += 1
    print("  top GPU activities (us a step, count a step):")
    for kernel, us in time.most_common(25):
        print(f"    {us / n:9.1f} {count[kernel] / n:5.1f}x  {kernel[:150]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
