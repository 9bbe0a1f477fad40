"""Where a first call's seconds go, per stage: a Llama's first step at 2 and 8 layers, and each new length.

    python -m benchmarks.experiments.compile_cost OUT.json [--device cuda] [--layers 2,8] [--lengths 8-14]
                                                [--modes infer,train] [--hidden 64 --heads 4 --kv-heads 2]
                                                [--dtype float32] [--batch 2] [--backends minicomp,inductor]
    TRITON_INTERPRET=1 python -m benchmarks.experiments.compile_cost OUT.json --tiny

Issue #42. transformers' Llama (random weights, vocab 128, intermediate 2x hidden) through
`torch.compile(model, backend="minicomp")`, in one process (a warm-up model compiled first by each backend, so each
row is a warm process's first call), fresh minicomp, Inductor and Triton caches and `torch._dynamo.reset()` per model.
For each mode (`infer`: no_grad logits; `train`: loss and backward) and layer count, the first
step at the first length, then one at each later length (Dynamo compiles the second length as a
dynamic graph, which minicomp compiles once per concrete size: capture/specialize.py). Each row:
- `first_s`: the step's wall time (a synchronize after it), `again_s` the same step once more
  (the run alone), `compile_s` = first_s - again_s;
- minicomp's stages summed over the graphs it compiled during the step (pipeline.Compiled.times):
  `retrace` (specialize: the dynamic graph made concrete for the new sizes), `ir`, `plan`,
  `codegen`, `load`, `compile ahead`; after the step, its kernels' `triton compile` and `tuning`
  waits and `triton compiles`, the binaries Triton compiled (`Compiled.breakdown`: 0 on the CPU,
  Triton's interpreter compiles nothing);
  `other` = compile_s minus those (Dynamo, AOTAutograd, first-call work outside minicomp);
  `compile_cpu_s`, `retrace_cpu`, `pipeline_cpu` (ir to load): the same in this process's CPU
  seconds (time.process_time), steadier than wall time on a shared machine;
- `graphs`: minicomp compiles (pipeline runs) during the step; `kernels`: kernel launches of the
  modules compiled; `distinct`: the distinct `Launch` objects among them (kernels alike but for
  their names share one: codegen/alike.py).
The summary gives the cost per extra layer ((first_s at the most layers - at the fewest) / the
difference) per mode, and the mean per-stage cost of a new length after the first two.
`--backends minicomp,inductor` adds Inductor's rows (its stage columns are 0: only `first_s`,
`again_s`, `compile_s` are measured for it); `aot_eager` (Dynamo and AOTAutograd, no compiler)
gives the floor every backend pays; a backend named `NAME:regional` (`minicomp:regional`) compiles
each decoder layer alone (`layer.compile(backend=NAME)`, regional compilation: identical layers
share one compile) and runs the rest of the model eagerly. `--tiny` runs 1 layer, lengths 5-7, training
steps unless `--modes` (the warm-up row is an inference step), on the CPU: a smoke run, its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

import torch

STAGES = ("retrace", "ir", "plan", "codegen", "load", "compile ahead", "triton compile", "tuning")


class Recorder:
    """minicomp's compiles during one step: each graph's stage seconds (pipeline.compile_graph's
    Compiled.times), the time specialize spends making a dynamic graph concrete, and the time a
    dynamic graph's probe size takes to write (`probe`: pipeline.write_graph, specialize.py)."""

    def __init__(self):
        from minicomp.capture import specialize
        from minicomp.dispatch import dynamo

        self.compiled: list = []
        self.retrace = self.retrace_cpu = self.pipeline_cpu = self.probe = self.probe_cpu = 0.0
        compile_graph = dynamo.compile_graph

        def recording_compile(*args, **kwargs):
            start = time.process_time()
            compiled = compile_graph(*args, **kwargs)
            self.pipeline_cpu += time.process_time() - start
            self.compiled.append(compiled)
            return compiled

        dynamo.compile_graph = recording_compile
        specialize.concrete = self._timing(specialize.concrete, "retrace")
        dynamo.write_graph = self._timing(dynamo.write_graph, "probe")

    def _timing(self, fn, name: str):
        """`fn`, adding its wall and CPU seconds to `self.<name>` and `self.<name>_cpu`."""

        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, name, getattr(self, name) + time.perf_counter() - start)
                setattr(self, f"{name}_cpu", getattr(self, f"{name}_cpu") + time.process_time() - cpu)

        return timed

    def reset(self):
        self.compiled, self.retrace, self.retrace_cpu, self.pipeline_cpu = [], 0.0, 0.0, 0.0
        self.probe = self.probe_cpu = 0.0

    def stages(self) -> dict:
        totals = collections.Counter({"retrace": self.retrace})
        for compiled in self.compiled:
            for stage, seconds in compiled.breakdown().items():
                if stage in (*STAGES, "triton compiles"):
                    totals[stage] += seconds
        launches = [c.launch(k) for c in self.compiled for k in c.kernels]
        return {
            **{s: round(totals[s], 4) for s in STAGES},
            "triton compiles": totals["triton compiles"],
            "retrace_cpu": round(self.retrace_cpu, 4),
            "pipeline_cpu": round(self.pipeline_cpu, 4),
            "probe": round(self.probe, 4),
            "probe_cpu": round(self.probe_cpu, 4),
            "graphs": len(self.compiled),
            "kernels": len(launches),
            "distinct": len({id(la) for la in launches}),
        }


def llama(layers: int, args, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        num_hidden_layers=layers,
        vocab_size=128,
        max_position_embeddings=4096,
        use_cache=False,
    )
    return LlamaForCausalLM(cfg).to(device=device, dtype=getattr(torch, args.dtype))


def stepper(model, mode: str, batch: int, device: str, backend: str = "minicomp"):
    backend, _, how = backend.partition(":")  # "minicomp:regional": each decoder layer compiled alone
    if backend == "minicomp":
        from minicomp.dispatch.dynamo import registered

        backend = registered()  # a source tree has no entry point
    if how == "regional":
        for layer in model.model.layers:
            layer.compile(backend=backend)
        compiled = model
    else:
        compiled = torch.compile(model, backend=backend)
    if mode == "infer":
        model.eval()
    else:
        model.train()

    def step(length: int):
        ids = torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(length)).to(device)
        if mode == "infer":
            with torch.no_grad():
                compiled(input_ids=ids)
        else:
            model.zero_grad(set_to_none=True)
            compiled(input_ids=ids, labels=ids).loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def timed(step, length: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one step."""
    start, cpu = time.perf_counter(), time.process_time()
    step(length)
    return time.perf_counter() - start, time.process_time() - cpu


def rows_for(layers: int, mode: str, args, device: str, recorder: Recorder, backend: str = "minicomp") -> list[dict]:
    for cache in ("MINICOMP_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        os.environ[cache] = tempfile.mkdtemp()  # nothing served from an earlier model's compile
    torch._dynamo.reset()
    step = stepper(llama(layers, args, device), mode, args.batch, device, backend)
    rows = []
    for i, length in enumerate(args.lengths):
        recorder.reset()
        first, first_cpu = timed(step, length)
        stages = recorder.stages()  # after the step: its kernels' compile and tuning waits too
        again, again_cpu = timed(step, length)
        compile_s = first - again
        known = sum(stages[s] for s in STAGES)
        row = dict(
            backend=backend,
            mode=mode,
            layers=layers,
            length=length,
            call=i + 1,
            first_s=round(first, 4),
            again_s=round(again, 4),
            compile_s=round(compile_s, 4),
            compile_cpu_s=round(first_cpu - again_cpu, 4),
            **stages,
            other=round(compile_s - known, 4),
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def summary(rows: list[dict], layer_counts: list[int]) -> dict:
    out = {}
    lo, hi = min(layer_counts), max(layer_counts)
    for backend, mode in sorted({(r["backend"], r["mode"]) for r in rows}):
        mine = [r for r in rows if r["backend"] == backend and r["mode"] == mode]
        first = {r["layers"]: r for r in mine if r["call"] == 1}
        mode = mode if backend == "minicomp" else f"{backend} {mode}"
        if hi != lo and lo in first and hi in first:
            out[f"{mode}: s per extra layer, first step"] = round(
                (first[hi]["first_s"] - first[lo]["first_s"]) / (hi - lo), 4
            )
            for stage in ("compile_s", "compile_cpu_s", "other", *STAGES, "pipeline_cpu"):
                out[f"{mode}: s per extra layer, {stage}"] = round((first[hi][stage] - first[lo][stage]) / (hi - lo), 4)
        for layers in layer_counts:
            later = [r for r in mine if r["layers"] == layers and r["call"] >= 3]
            if later:
                keys = ("compile_s", "compile_cpu_s", "other", *STAGES, "retrace_cpu", "pipeline_cpu")
                mean = {k: round(sum(r[k] for r in later) / len(later), 4) for k in keys}
                out[f"{mode}, {layers} layers: a new length after the first two (mean)"] = mean
    return out


def lengths(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="where the JSON results go")
    parser.add_argument("--tiny", action="store_true", help="1 layer, 3 lengths, train, CPU: a smoke run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", default="2,8")
    parser.add_argument("--lengths", default="8-14", help="A-B or a,b,c: the first is the first step's")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--backends", default="minicomp", help="minicomp,inductor: both, side by side (a GPU)")
    parser.add_argument("--no-probe", action="store_true", help='config "probe_sizes" off (capture/specialize.py)')
    args = parser.parse_args(argv)
    if args.no_probe:
        from minicomp import config

        config.DEFAULTS["probe_sizes"] = False  # (this process's default: every thread's)
    if args.tiny:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--tiny runs on the CPU through Triton's interpreter: set TRITON_INTERPRET=1")
        args.device, args.layers, args.lengths, args.hidden, args.heads, args.kv_heads = "cpu", "1", "5-7", 32, 4, 2
        if args.modes == parser.get_default("modes"):
            args.modes = "train"  # (the warm-up row is an inference step)
    args.lengths = lengths(args.lengths)
    layer_counts = [int(x) for x in args.layers.split(",")]
    recorder = Recorder()
    warm = argparse.Namespace(**{**vars(args), "lengths": args.lengths[:1]})
    for backend in args.backends.split(","):  # imports and one-time costs (worker pools), not counted
        rows_for(1, "infer", warm, args.device, recorder, backend)
    rows = [
        row
        for backend in args.backends.split(",")
        for mode in args.modes.split(",")
        for layers in layer_counts
        for row in rows_for(layers, mode, args, args.device, recorder, backend)
    ]
    result = summary(rows, layer_counts)
    print(json.dumps(result, indent=1), flush=True)
    device = (
        "cpu (--tiny: not a measurement)"
        if args.tiny
        else (torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)")
    )
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    with open(args.out, "w") as f:
        json.dump(dict(device=device, settings=settings, summary=result, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
