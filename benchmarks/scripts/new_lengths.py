"""What each new sequence length costs a suite model's inference step, stage by stage (issue #42).

    PYTHONPATH=. python benchmarks/scripts/new_lengths.py MODEL [minicomp|inductor] [S S S ...] [--no-probe]

MODEL: a key of minicomp/bench/model_specs.MODELS (a language model). In one process, a fresh
minicomp cache and a fresh Triton cache (so no binary comes from an earlier process), the
model's bf16 inference step through `torch.compile` at each length (default: S, S-1, S-2, S-3,
S-5, S-8, S-16 for the suite's S; Dynamo compiles the first as a static graph, the second as a
dynamic one). One line per length: the first call's seconds (to a synchronize), the same call
again, the largest error of the logits against the eager model at that length, and for minicomp
the stages of the compiles it made (benchmarks/experiments/compile_cost.py `Recorder`: retrace,
ir, plan, codegen, load, compile ahead, Triton compile and tuning waits, binaries compiled), then
the steady state: the median of 20 calls at that length (CUDA events, ms). `--no-probe`: config
"probe_sizes" off (capture/specialize.py). The GPU only.
"""

import importlib
import json
import os
import sys
import tempfile
import time

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

sys.path.insert(0, os.getcwd())  # benchmarks/ from the tree this runs in
from benchmarks.experiments.compile_cost import Recorder  # noqa: E402
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.bench.measure import synchronized_ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def logits(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)


def timed(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def steady_ms(fn, calls: int = 20) -> float:
    with torch.no_grad():
        return synchronized_ms(fn, calls)


def main(name: str, backend: str, lengths: list[int]) -> None:
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    recorder = Recorder() if backend == "minicomp" else None
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "infer", "cuda", bf16)
    compiled = torch.compile(task, backend=registered() if backend == "minicomp" else "inductor")
    for length in lengths or [sizes.length - d for d in (0, 1, 2, 3, 5, 8, 16)]:
        args, kwargs, _ = ms.step_inputs(spec, sizes, "infer", task, length, "cuda", bf16, bf16)
        if recorder:
            recorder.reset()
        first, out = timed(lambda: compiled(*args, **kwargs))  # noqa: B023
        again, _ = timed(lambda: compiled(*args, **kwargs))  # noqa: B023
        steady = steady_ms(lambda: compiled(*args, **kwargs))  # noqa: B023
        _, reference = timed(lambda: task(*args, **kwargs))  # noqa: B023
        error = (logits(out).float() - logits(reference).float()).abs().max().item()
        stages = json.dumps(recorder.stages()) if recorder else ""
        line = f"{name} {backend} S={length} first {first:.3f} s again {again:.4f} s steady {steady:.3f} ms"
        line += f" err {error:.4f}"
        print(line, stages, flush=True)


if __name__ == "__main__":
    from minicomp import config

    config.DEFAULTS["probe_sizes"] = "--no-probe" not in sys.argv  # (this process's default: every thread's)
    argv = [a for a in sys.argv[1:] if a != "--no-probe"]
    main(argv[0], argv[1] if len(argv) > 1 else "minicomp", [int(a) for a in argv[2:]])
