"""What a suite model's training forward saves for its backward: the large values, with the ops
that made them (issue #41's memory pass: dispatch/partition.py, dispatch/expanding_products.py).

    PYTHONPATH=. python benchmarks/scripts/saved_values.py MODEL [VARIANT] [MIN_ELEMENTS]

MODEL: a key of minicomp/bench/model_specs.MODELS; VARIANT as in minicomp/bench/model_row.py
(`minicomp` by default); MIN_ELEMENTS: the smallest value listed (1,000,000). After one training
step, each saved value of the last forward graph minicomp compiled at least that large: its
name, shape, dtype and its producers' ops, six deep. `MINICOMP_LOGS=fusion` also prints the
products recomputed in the backward. The GPU only.
"""

import importlib
import os
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch import saved_layouts  # noqa: E402


def producers(node, depth: int = 0) -> str:
    """`node`'s op over its inputs' ops, `depth` levels down (six at most)."""
    if depth > 6 or getattr(node, "op", None) != "call_function":
        return getattr(node, "name", str(node))
    inputs = ", ".join(producers(a, depth + 1) for a in node.args if hasattr(a, "op"))
    return f"{node.target}({inputs})"


def main(name: str, variant: str = "minicomp", least: int = 1_000_000) -> None:
    forwards = []
    mark = saved_layouts.mark
    saved_layouts.mark = lambda fw, bw: (forwards.append(fw), mark(fw, bw))[1]
    spec, bf16 = ms.MODELS[name], torch.bfloat16
    sizes = spec.sizes(False)
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "train", "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, "train", task, sizes.length, "cuda", bf16, bf16)
    model_row.compiled(task, variant)(*args, target=target, **kwargs).backward()
    for node in list(forwards[-1].graph.nodes)[-1].args[0]:
        value = getattr(node, "meta", {}).get("val")
        if isinstance(value, torch.Tensor) and value.numel() >= least:
            print("SAVED", node.name, tuple(value.shape), value.dtype, producers(node)[:1500])


if __name__ == "__main__":
    main(*sys.argv[1:3], *map(int, sys.argv[3:4]))
