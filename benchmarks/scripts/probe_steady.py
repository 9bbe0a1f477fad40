"""A dynamic graph's steady state with and without its probe size (issue #42).

    PYTHONPATH=. python benchmarks/scripts/probe_steady.py MODEL on|off [S S S ...]

MODEL: a language model of minicomp/bench/model_specs.MODELS. Its bf16 inference step through
`torch.compile(backend="minicomp")` at each length (default: S, S-1, S-2, S-5 for the suite's S),
config "probe_sizes" on or off (capture/specialize.py: with it on, the kernels the dynamic graph
starts at S-1 are its families' templates, sizes as runtime arguments, where they were literals).
Then at every length after the first: the GPU's busy ms in one step (torch.profiler, the median
of 5 steps) and the step's median ms (CUDA events, bench/model_row.py). One JSON line a length.
The GPU only; run `on` and `off` in alternating processes (the kernels' families are per process).
"""

import importlib
import json
import os
import statistics
import sys
import tempfile

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

from minicomp import config  # noqa: E402
from minicomp.bench import model_row  # noqa: E402
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def main(name: str, probe: str, lengths: list[int]) -> None:
    config.DEFAULTS["probe_sizes"] = probe == "on"  # (this process's default: every thread's)
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "infer", "cuda", bf16)
    compiled = torch.compile(task, backend=registered())
    lengths = lengths or [sizes.length - d for d in (0, 1, 2, 5)]
    steps = {}
    with torch.no_grad():
        for length in lengths:
            args, kwargs, _ = ms.step_inputs(spec, sizes, "infer", task, length, "cuda", bf16, bf16)
            steps[length] = lambda args=args, kwargs=kwargs: compiled(*args, **kwargs)
            steps[length]()  # (compiled at this length)
        for length in lengths[1:]:
            busy = statistics.median(model_row.kernels(steps[length], "cuda")[2] for _ in range(5))
            ms_ = model_row.median_ms(steps[length], "cuda")
            print(
                json.dumps(dict(model=name, probe=probe, length=length, busy_ms=round(busy, 4), step_ms=round(ms_, 4)))
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]])
