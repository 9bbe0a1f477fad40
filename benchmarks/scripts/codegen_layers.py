"""A suite model's first training step at a number of layers, on the CPU: minicomp's compile stages
and its meta-kernel questions (issue #42: what each extra layer costs).

    PYTHONPATH=. python benchmarks/scripts/codegen_layers.py MODEL LAYERS

MODEL: a key of minicomp/bench/model_specs.MODELS with a transformers model; LAYERS: its
`model_specs.LAYERS`. The tiny config's step runs through `torch.compile(backend="minicomp")`
(kernels through Triton's interpreter: the step's own seconds mean nothing); printed: the
pipeline's CPU seconds and its stages summed over the graphs (benchmarks/experiments/compile_cost.py
`Recorder`), and the questions codegen asked of meta kernels and how many it computed
(codegen/meta_answers.py). Run at two layer counts: the difference over the extra layers is a
layer's cost. No GPU needed.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
import transformers  # noqa: E402

from benchmarks.experiments.compile_cost import Recorder  # noqa: E402
from minicomp.bench import model_row, model_specs  # noqa: E402
from minicomp.codegen import meta_answers  # noqa: E402


def main(name: str, layers: int) -> None:
    made = []
    init = meta_answers.Answers.__init__

    def counted(self):
        init(self)
        made.append(self)

    meta_answers.Answers.__init__ = counted
    model_specs.LAYERS = layers
    spec = model_specs.MODELS[name]
    s, f32 = spec.sizes(True), torch.float32
    task = model_specs.build_task(spec, transformers, s, "train", "cpu", f32)
    args, kwargs, target = model_specs.step_inputs(spec, s, "train", task, s.length, "cpu", f32, f32)
    recorder = Recorder()
    model_row.make_step(task, model_row.compiled(task, "minicomp"), "train", args, kwargs, target)()
    asked, computed = sum(a.asked for a in made), sum(a.computed for a in made)
    print(name, layers, "layers:", json.dumps(recorder.stages()), f"meta questions {asked}, computed {computed}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
