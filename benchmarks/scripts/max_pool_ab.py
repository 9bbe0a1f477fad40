"""ResNet-50's training step with and without max pooling decomposed (capture/max_pool.py), one
process, the two compiled models timed in turn.

    PYTHONPATH=. python benchmarks/scripts/max_pool_ab.py

Prints each round's ms a step (20 steps) for both, and the medians. The GPU only.
"""

import importlib
import os
import statistics
import tempfile
import time

import torch

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()

from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.capture import tracing  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def build():
    spec = ms.MODELS["resnet50"]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "train", "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, "train", task, sizes.length, "cuda", bf16, bf16)
    compiled = torch.compile(task, backend=registered())

    def step():
        compiled(*args, target=target, **kwargs).backward()
        task.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    return step


def ms_a_step(step, n: int = 20) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    decomposed = build()
    tracing.decompositions().pop(torch.ops.aten.max_pool2d_with_indices.default)  # ATen's op from here on
    torch._dynamo.reset()
    aten = build()
    rounds = {"with": [], "without": []}
    for _ in range(5):
        rounds["with"].append(ms_a_step(decomposed))
        rounds["without"].append(ms_a_step(aten))
    print({k: [round(x, 2) for x in v] for k, v in rounds.items()})
    medians = {k: round(statistics.median(v), 3) for k, v in rounds.items()}
    print("median ms with", medians["with"], "without", medians["without"])


if __name__ == "__main__":
    main()
