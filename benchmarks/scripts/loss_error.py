"""Where a language model's training loss parts from float32: each hidden state, the logits and the
loss of a suite model's training forward (grad on), against float32 eager on the same bf16-rounded
weights and inputs, for eager bf16, Inductor and minicomp variants, in one process.

    PYTHONPATH=. python benchmarks/scripts/loss_error.py MODEL [VARIANT ...] [--tiny] [--nograd]

MODEL: gpt2, bert or llama (minicomp/bench/model_specs.py). VARIANT: as the model suite spells
them (`eager`, `inductor`, `minicomp`, `minicomp:split_min_numel=1099511627776`); default eager,
inductor, minicomp. Prints one `ERR {json}` line per variant: for each output (`h0`.. the hidden
states, `logits`, `loss`), the mean and max absolute difference from float32 and the mean signed
difference (a bias shows there; rounding alone averages out). Issue #38's goal: errors against
float32 eager no larger than Inductor's. --tiny: the CPU (Triton's interpreter), tiny widths.
"""

import importlib
import json
import sys

import torch
import torch.nn.functional as F

from minicomp.bench.model_row import compiled
from minicomp.bench.model_specs import MODELS, build_task, step_inputs


def outputs(task, ids, target):
    """The hidden states, the logits and the loss of one training forward."""
    out = task.model.inner(ids, output_hidden_states=True)
    loss = F.cross_entropy(out.logits.flatten(0, -2).float(), target.flatten())
    return (*out.hidden_states, out.logits, loss)


def names(count: int) -> list[str]:
    return [f"h{i}" for i in range(count - 2)] + ["logits", "loss"]


def difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = a.detach().double() - b.detach().double()
    return dict(mean=d.abs().mean().item(), max=d.abs().max().item(), signed=d.mean().item())


def main(argv: list[str]) -> None:
    tiny, nograd = "--tiny" in argv, "--nograd" in argv
    argv = [a for a in argv if a not in ("--tiny", "--nograd")]
    name, variants = argv[0], argv[1:] or ["eager", "inductor", "minicomp"]
    spec = MODELS[name]
    device, dtype = ("cpu", torch.bfloat16) if tiny else ("cuda", torch.bfloat16)
    library = importlib.import_module(spec.library)
    sizes = spec.sizes(tiny)
    reference = build_task(spec, library, sizes, "train", device, dtype, reference=True)
    (ids,), _, target = step_inputs(spec, sizes, "train", reference, sizes.length, device, dtype, dtype)
    with torch.no_grad():
        truth = outputs(reference, ids, target)
    del reference
    for variant in variants:
        torch._dynamo.reset()
        task = build_task(spec, library, sizes, "train", device, dtype)
        with torch.set_grad_enabled(not nograd):
            got = compiled(Outputs(task), variant)(ids, target)
        row = {n: difference(g, t) for n, g, t in zip(names(len(truth)), got, truth)}
        print("ERR " + json.dumps(dict(model=name, variant=variant, grad=not nograd, **row)), flush=True)
        del task, got


class Outputs(torch.nn.Module):
    """`outputs` of a task, as a module the suite's variants compile."""

    def __init__(self, task):
        super().__init__()
        self.task = task

    def forward(self, ids, target):
        return outputs(self.task, ids, target)


if __name__ == "__main__":
    main(sys.argv[1:])
