"""Whole models, eager / Inductor / minicomp side by side: a row per model, step and variant.

    minicomp bench models OUT.json [--models gpt2,llama] [--steps train,infer]
                                   [--variants eager,minicomp] [--timeout 900]
    TRITON_INTERPRET=1 minicomp bench models OUT.json --tiny
    (python -m benchmarks.experiments.model_suite ... runs the same)

Install the models' libraries with `pip install -e '.[models]'` (transformers, torchvision; take
a torchvision built for the torch you have). A row whose library does not import is skipped.

The model suite of issues #38, #39, #41 and #42. Models (MODELS below: random weights, nothing
downloaded; bf16 on the GPU, 2 layers at real widths): transformers' GPT-2 (d1024, vocab 50257),
BERT (base widths, vocab 30522, S512), Llama (d2048, GQA 16/4), torchvision's ResNet-50 (batch 64,
channels_last) where torchvision imports, and a DLRM in the seed talk's shape (26 tables, MLPs
512-256, batch 8192). Steps: `train` (forward, loss, backward; gradients set to None, no
optimizer), `infer` (no_grad), and for the decoders `decode` (batch 1, one new token, no KV
cache) and `decode-static` (the same at position S/2 of transformers' StaticCache, filled
eagerly first; the cache's own length set back to S/2 before it reaches the end: model_specs.
`rewinding`). Variants: `eager`, `inductor` (torch.compile's default), `inductor-ro`
(mode="reduce-overhead", decode rows only), `minicomp` (backend="minicomp"), `minicomp-graphs`
(backend="minicomp", mode="reduce-overhead": CUDA graphs, runtime/graphs.py; decode rows only),
either with torch.compile options after a colon, joined by `+` (`minicomp:chunk_budget_bytes=134217728`:
config's tunables, a row of its own);
on request, `aot_eager` (Dynamo and AOTAutograd with eager kernels: its first call is the part of
every torch.compile backend's first call that comes before the backend compiles anything).

Each row runs in a process of its own with empty compiler caches (a cold first call, as a user's
first run has it) under a time limit; the child prints its results as `SUITE {json}` lines as
they come, so a crash or timeout costs only what that row had not reached. OUT.json gets the
device and the rows, OUT.jsonl each row as it finished; a markdown table and the top kernels are
printed. Env MODELS, STEPS, VARIANTS, SUITE_TIMEOUT choose as the flags do (the flags win).
`--tiny` (tiny configs on the CPU, Triton's interpreter) runs DLRM's train and GPT-2's
decode-static rows, eager and minicomp, unless chosen otherwise: a smoke run, its numbers mean nothing.

Columns of a row:
- ms: median step, CUDA events around each of 30 steps after 10 warm-up steps;
- first_s: the process's first step, compile included (wall clock to a synchronize); second_s:
  the step after it (what a first step leaves to the next: a recompile, a late tuning);
  import_s: from the process's start to torch, the model's library and the compiler (minicomp,
  or Inductor's compile_fx) imported; build_s: the model and its inputs built on the device
  (transformers' lazy import of the model's module included);
- second_len_s, new_len_s (`infer` of decoders): a call at length S-1, then one at S-2, the third
  length (issue #42's cost of a new length);
- kernels: GPU activities (kernels, copies, memsets) of one step, torch.profiler; top: the 10
  longest of them by name (us per step, count); gpu_ms: the time that step's GPU was busy (the
  union of its activities' time ranges); host_ms: the median step less gpu_ms (launches, Python,
  allocation: issue #39's host time without graphs);
- peak_mib: torch.cuda.max_memory_allocated during a step, above what was allocated before it
  (train: gradients are set to None at the end of each step, so they count in the peak);
- held_mib, held_reserved_mib: memory the compiled step keeps between calls (allocated, and
  reserved by the allocator), after the warm-up and timed steps, above what was held before it was
  compiled: a graphed row's memory pool (issue #39 compares it with reduce-overhead's);
- err: max |output - eager's| (train: the loss; else the logits, at most 2**20 evenly strided
  values); err_fp32: the same against float32 eager of the same (bf16-rounded) weights and inputs;
  err_mean_fp32: the mean |output - float32 eager's|; grad_err_fp32 (train): the median over
  parameters of sum |gradient - float32 eager's| / sum |float32 eager's| (a loss is one number, its
  error one draw of the per-token errors' mean; the gradients' error is steady);
- x_inductor (minicomp rows): minicomp / Inductor of ms, first_s, peak_mib, held_mib and host_ms; x_inductor_ro the
  same against reduce-overhead (decode rows);
- fallbacks: minicomp's warnings of graphs run eagerly (their first lines); graphs and
  graph_breaks: Dynamo's counters.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minicomp.bench.model_row import PREFIX
from minicomp.bench.model_specs import LAYERS, MODELS

STEPS = ("train", "infer", "decode", "decode-static")
VARIANTS = ("eager", "inductor", "inductor-ro", "minicomp", "minicomp-graphs")  # eager first: the others' reference
# on request only: torch.compile's capture alone (Dynamo and AOTAutograd, eager kernels), whose first
# call is what any torch.compile backend pays before compiling anything: the floor of a first call
ON_REQUEST = ("aot_eager",)
GRAPHED = ("inductor-ro", "minicomp-graphs")  # CUDA graphs: decode rows only
# --tiny's rows unless chosen otherwise (each interpreted row takes 5-30 s on a 2-core machine)
TINY_ROWS, TINY_VARIANTS = [("dlrm", "train"), ("gpt2", "decode-static")], ("eager", "minicomp")


def jobs(pairs, variants) -> list[dict]:
    """The rows of (model, step) pairs, eager first within each (the others' reference)."""
    out = []
    for model, step in pairs:
        if step.startswith("decode") and not MODELS[model].decoder:
            continue
        for variant in (v for base in VARIANTS + ON_REQUEST for v in variants if v.partition(":")[0] == base):
            if variant.partition(":")[0] not in GRAPHED or step.startswith("decode"):
                out.append(dict(model=model, step=step, variant=variant))
    return out


def run_row(job: dict, scratch: str, tiny: bool, timeout: float) -> dict:
    """The row of one child process: its SUITE lines merged, a status for a crash or timeout."""
    row = dict(job)
    spec = MODELS[job["model"]]
    if spec.library and importlib.util.find_spec(spec.library) is None:
        return dict(row, status=f"skipped: no {spec.library}")
    cache = tempfile.mkdtemp(dir=scratch)
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=f"{cache}/mc",
        TORCHINDUCTOR_CACHE_DIR=f"{cache}/ind",
        TRITON_CACHE_DIR=f"{cache}/triton",
    )
    if not tiny:  # Python's bytecode as an installed torch has it (bench/run.py probe_env), filled by _prime
        env["PYTHONPYCACHEPREFIX"] = f"{scratch}/pycache"
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    child_job = dict(job, tiny=tiny, refs=scratch, spawned=time.time())
    command = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "minicomp.bench.model_row"]
    proc = subprocess.Popen(
        [*command, json.dumps(child_job)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else f"crash (rc {proc.returncode}): {_last_error(stderr)}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
        stdout, stderr = proc.communicate()
        status = f"timeout after {timeout:.0f} s"
    for line in stdout.splitlines():
        if line.startswith(PREFIX):
            row.update(json.loads(line[len(PREFIX) :]))
    row.setdefault("status", status)
    return row


def _prime(scratch: str, models) -> None:
    """An untimed import of everything the rows import, filling the shared bytecode cache."""
    libraries = {MODELS[m].library for m in models} - {None}
    names = ["torch._inductor.compile_fx", "minicomp", *(n for n in libraries if importlib.util.find_spec(n))]
    env = dict(os.environ, PYTHONPYCACHEPREFIX=f"{scratch}/pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import " + ", ".join(names)], env=env, check=False)


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    return (errors or lines or [""])[-1][:300]


def add_ratios(rows: list[dict]) -> None:
    """x_inductor (and x_inductor_ro) on minicomp rows: minicomp / Inductor of ms, first_s, second_s,
    peak_mib, held_mib, host_ms."""
    by_key = {(r["model"], r["step"], r["variant"]): r for r in rows}
    for row in rows:
        if row["variant"].partition(":")[0] not in ("minicomp", "minicomp-graphs"):
            continue
        for base, key in (("inductor", "x_inductor"), ("inductor-ro", "x_inductor_ro")):
            other = by_key.get((row["model"], row["step"], base), {})
            measures = ("ms", "first_s", "second_s", "peak_mib", "held_mib", "host_ms")
            ratios = {m: row[m] / other[m] for m in measures if row.get(m) and other.get(m)}
            if ratios:
                row[key] = ratios


COLUMNS = [
    ("model", "model"), ("step", "step"), ("variant", "variant"), ("ms", "ms"), ("x_inductor", "x Ind"),
    ("gpu_ms", "GPU ms"), ("host_ms", "host ms"),
    ("first_s", "first s"), ("second_s", "second s"), ("import_s", "import s"), ("new_len_s", "new len s"),
    ("kernels", "kernels"),
    ("peak_mib", "peak MiB"), ("err", "err"), ("err_fp32", "err fp32"), ("err_mean_fp32", "mean err fp32"),
    ("grad_err_fp32", "grad err fp32"), ("status", "status"),
]  # fmt: skip


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(key, row) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def _cell(key: str, row: dict) -> str:
    value = row.get(key)
    if key == "x_inductor":
        value = (value or {}).get("ms")
    if key == "status" and row.get("fallbacks"):
        value = f"{value}; {len(row['fallbacks'])} fallback(s): {row['fallbacks'][0][:120]}"
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if "err" in key else f"{value:.2f}"
    return str(value).replace("|", "/")


def top_kernels(rows: list[dict]) -> str:
    parts = []
    for row in rows:
        if row["variant"] in ("minicomp", "inductor") and row.get("top"):
            parts.append(f"### {row['model']} {row['step']} {row['variant']}")
            parts += [f"    {us:10.1f} us  {n:4d}x  {name}" for us, n, name in row["top"]]
    return "\n".join(parts)


def _options(argv):
    parser = argparse.ArgumentParser(add_help=False)
    for name in ("models", "steps", "variants"):
        parser.add_argument(f"--{name}", default=os.environ.get(name.upper()))
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("SUITE_TIMEOUT", 0)) or None)
    return parser.parse_known_args(argv)


@dataclass(frozen=True)
class _Run:
    out: str
    tiny: bool

    def write(self, **data) -> None:
        device = "cpu (--tiny: not a measurement)" if self.tiny else torch.cuda.get_device_name()
        with open(self.out, "w") as f:
            json.dump(dict(device=device, **data), f, indent=1)


def _parse(argv) -> _Run:
    parser = argparse.ArgumentParser(
        prog="minicomp bench models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="where the JSON results go (OUT.jsonl: each row as it finishes; OUT.png: the plot)")
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (set TRITON_INTERPRET=1)")
    for name in ("models", "steps", "variants"):
        parser.add_argument(f"--{name}", help=f"comma-separated (env {name.upper()}): default all")
    parser.add_argument("--timeout", type=float, help="seconds a row may take (env SUITE_TIMEOUT)")
    args = parser.parse_args(argv)
    if args.tiny and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--tiny runs minicomp's kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    if not args.tiny and not torch.cuda.is_available():
        parser.error("the model suite measures on a GPU; on the CPU, --tiny runs it as a smoke test")
    return _Run(args.out, args.tiny)


def plot(rows: list[dict], path: Path) -> Path | None:
    """A bar per minicomp row: its step time and peak memory over Inductor's (1 is Inductor's; a
    graphed row's over reduce-overhead's). None without matplotlib or without such a row."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    against = {"minicomp": "x_inductor", "minicomp-graphs": "x_inductor_ro"}  # each with its own kind
    bars = [r for r in rows if r.get(against.get(r["variant"], ""))]
    if not bars:
        return None
    labels = [f"{r['model']} {r['step']}" + (" (graphs)" if r["variant"] == "minicomp-graphs" else "") for r in bars]
    ratios = [r[against[r["variant"]]] for r in bars]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(bars) + 2), 4))
    width = 0.4
    for k, (key, name) in enumerate((("ms", "step time"), ("peak_mib", "peak memory"))):
        values = [ratio.get(key, 0) for ratio in ratios]
        ax.bar([i + (k - 0.5) * width for i in range(len(bars))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(len(bars)), labels, rotation=30, ha="right")
    ax.set_ylabel("minicomp / Inductor (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    options, rest = _options(sys.argv[1:] if argv is None else argv)
    run = _parse(rest)
    models = options.models.split(",") if options.models else list(MODELS)
    steps = options.steps.split(",") if options.steps else list(STEPS)
    variants = options.variants.split(",") if options.variants else TINY_VARIANTS if run.tiny else VARIANTS
    kinds = {v.partition(":")[0] for v in variants}  # (`minicomp:NAME=VALUE+NAME=VALUE`: options)
    unknown = set(models) - set(MODELS) | set(steps) - set(STEPS) | kinds - set(VARIANTS + ON_REQUEST)
    if unknown:
        raise SystemExit(f"unknown models, steps or variants: {sorted(unknown)}")
    pairs = [(model, step) for model in models for step in steps]
    if run.tiny and not (options.models or options.steps):
        pairs = TINY_ROWS
    models = sorted({model for model, _ in pairs})
    timeout = options.timeout or (120 if run.tiny else 900)
    rows = []
    stream = Path(run.out).with_suffix(".jsonl")
    stream.write_text("")
    with tempfile.TemporaryDirectory() as scratch:
        if not run.tiny:
            _prime(scratch, models)
        for job in jobs(pairs, variants):
            row = run_row(job, scratch, run.tiny, timeout)
            rows.append(row)
            with stream.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "top"}, flush=True)
    add_ratios(rows)
    run.write(rows=rows, layers=LAYERS, sizes={m: MODELS[m].sizes(run.tiny).__dict__ for m in models})
    print(markdown(rows))
    print(top_kernels(rows))
    if (picture := plot(rows, Path(run.out).with_suffix(".png"))) is not None:
        print(f"plot: {picture}")


if __name__ == "__main__":
    main()
