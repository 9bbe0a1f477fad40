"""What the generated `call` of a suite model's step does besides launching kernels, on the CPU.

    PYTHONPATH=. python -P benchmarks/scripts/wrapper_lines.py MODEL STEP      # from a tree's root

MODEL: a key of minicomp/bench/model_specs.MODELS with a transformers model (gpt2, bert, llama);
STEP: infer or train. The tiny config (2 layers) runs one step through `torch.compile(backend=
"minicomp")` on the CPU; printed, summed over the graphs it compiled (forward and backward): the ATen
calls of their `call`, the views it makes by `reinterpret`, the checks of an ATen result's layout
(`conform`) and the getitems of a multi-output op. The same counts hold at the real widths (the
graphs are the same; only sizes differ). `WRAPPER_LINES_DUMP=DIR` also writes each graph's module
there, to read. No GPU needed.
"""

import collections
import os
import re
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
import transformers  # noqa: E402

from minicomp import pipeline  # noqa: E402
from minicomp.bench import model_row, model_specs  # noqa: E402
from minicomp.dispatch import dynamo  # noqa: E402


def main(name: str, step: str) -> None:
    sources = []
    compile_graph = pipeline.compile_graph

    def recording(*args, **kwargs):
        compiled = compile_graph(*args, **kwargs)
        sources.append(compiled.source)
        return compiled

    dynamo.compile_graph = pipeline.compile_graph = recording
    spec = model_specs.MODELS[name]
    sizes = spec.sizes(True)
    task = model_specs.build_task(spec, transformers, sizes, step, "cpu", torch.float32)
    args, kwargs, target = model_specs.step_inputs(
        spec, sizes, step, task, sizes.length, "cpu", torch.float32, torch.float32
    )
    model_row.make_step(task, model_row.compiled(task, "minicomp"), step, args, kwargs, target)()
    counts = collections.Counter()
    for source in sources:
        call = source[source.index("def call_boxed") :]
        counts["ATen calls"] += len(re.findall(r"= torch\.(ops|_C)\.", call))
        counts["reinterprets"] += call.count("= reinterpret(")
        counts["layout checks"] += call.count("conform(")
        counts["getitems"] += len(re.findall(r"= \w+\[\d+\]$", call, re.M))
    print(name, step, f"{len(sources)} graphs", dict(counts))
    if os.environ.get("WRAPPER_LINES_DUMP"):  # a folder: each graph's module source, to read
        for index, source in enumerate(sources):
            with open(os.path.join(os.environ["WRAPPER_LINES_DUMP"], f"{name}_{step}_{index}.py"), "w") as f:
                f.write(source)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
