"""One model of the suite, one training step, profiled: step time, GPU busy time, every kernel.

    PYTHONPATH=. python benchmarks/scripts/profile_model_step.py MODEL VARIANT [OUT_DIR]

MODEL: a key of minicomp/bench/model_specs.MODELS (gpt2, bert, llama, resnet50, dlrm);
VARIANT: minicomp or inductor. Prints `step ms` (CUDA events over 20 steps after 5 warm-up steps),
`gpu busy ms` (the sum of the GPU activities of a step, torch.profiler, mean of 3) and the kernel
count; writes every kernel (us per step, count) to OUT_DIR/MODEL_VARIANT.txt. A step much longer
than its busy time is the host's (Python, launches). With MINICOMP_LOGS=fusion the padded-matmul
decisions (plan/pad_matmuls.py) are logged as the model compiles. A GPU only.
"""

import importlib
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from minicomp.bench import model_specs as ms
from minicomp.dispatch.dynamo import registered


def main(name: str, variant: str, out: str) -> None:
    spec = ms.MODELS[name]
    sizes = spec.sizes(False)
    library = importlib.import_module(spec.library) if spec.library else None
    task = ms.build_task(spec, library, sizes, "train", "cuda", torch.bfloat16)
    args, kwargs, target = ms.step_inputs(
        spec, sizes, "train", task, sizes.length, "cuda", torch.bfloat16, torch.bfloat16
    )
    compiled = torch.compile(task) if variant == "inductor" else torch.compile(task, backend=registered())

    def step():
        compiled(*args, target=target, **kwargs).backward()
        for p in task.parameters():
            p.grad = None

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        step()
    end.record()
    torch.cuda.synchronize()
    step_ms = start.elapsed_time(end) / 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.key_averages() if e.device_type.name == "CUDA"), key=lambda e: -e.self_device_time_total
    )
    busy, count = sum(e.self_device_time_total for e in events) / 3, sum(e.count for e in events) / 3
    line = f"{name} {variant} step {step_ms:.3f} ms  gpu busy {busy / 1e3:.3f} ms  kernels {count:.0f}"
    with open(os.path.join(out, f"{name}_{variant}.txt"), "w") as f:
        f.write(line + "\n")
        for e in events:
            f.write(f"{e.self_device_time_total / 3:9.1f} us {e.count // 3:4d}x {e.key[:200]}\n")
    print(line, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ".")
