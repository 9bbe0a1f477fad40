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
eagerly first). Variants: `eager`, `inductor` (torch.compile's default), `inductor-ro`
(mode="reduce-overhead", decode rows only), `minicomp` (backend="minicomp"), `minicomp-graphs`
(backend="minicomp", mode="reduce-overhead": CUDA graphs, runtime/graphs.py; decode rows only).

Each row runs in a process of its own with empty compiler caches (a cold first call, as a user's
first run has it) under a time limit; the child prints its results as `SUITE {json}` lines as
they come, so a crash or timeout costs only what that row had not reached. OUT.json gets the
device and the rows, OUT.jsonl each row as it finished; a markdown table and the top kernels are
printed. Env MODELS, STEPS, VARIANTS, SUITE_TIMEOUT choose as the flags do (the flags win).
`--tiny` (tiny configs on the CPU, Triton's interpreter) runs DLRM's train and GPT-2's
decode-static rows, eager and minicomp, unless chosen otherwise: a smoke run, its numbers mean nothing.

Columns of a row:
- ms: median step, CUDA events around each of 30 steps after 10 warm-up steps;
- first_s: the process's first step, compile included (wall clock to a synchronize);
  import_s: from the process's start to torch, the model's library and the compiler (minicomp,
  or Inductor's compile_fx) imported; build_s: the model and its inputs built on the device
  (transformers' lazy import of the model's module included);
- second_len_s, new_len_s (`infer` of decoders): a call at length S-1, then one at S-2, the third
  length (issue #42's cost of a new length);
- kernels: GPU activities (kernels, copies, memsets) of one step, torch.profiler; top: the 10
  longest of them by name (us per step, count);
- peak_mib: torch.cuda.max_memory_allocated during a step, above what was allocated before it
  (train: gradients are set to None at the end of each step, so they count in the peak);
- err: max |output - eager's| (train: the loss; else the logits, at most 2**20 evenly strided
  values); err_fp32: the same against float32 eager of the same (bf16-rounded) weights and inputs;
- x_inductor (minicomp rows): minicomp / Inductor of ms, first_s and peak_mib; x_inductor_ro the
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
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

PREFIX = "SUITE "  # the child's result lines; everything else it prints is ignored
LAYERS = 2
STEPS = ("train", "infer", "decode", "decode-static")
VARIANTS = ("eager", "inductor", "inductor-ro", "minicomp", "minicomp-graphs")  # eager first: the others' reference
GRAPHED = ("inductor-ro", "minicomp-graphs")  # CUDA graphs: decode rows only
# --tiny's rows unless chosen otherwise (each interpreted row takes 5-30 s on a 2-core machine)
TINY_ROWS, TINY_VARIANTS = [("dlrm", "train"), ("gpt2", "decode-static")], ("eager", "minicomp")
WARMUP, TIMED, SAMPLED = 10, 30, 1 << 20


# ---------------------------------------------------------------- the models, in one place


class Logits(nn.Module):
    """A transformers model's `.logits`."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs).logits


class Task(nn.Module):
    """A model and its loss: forward(*inputs) gives the logits, forward(*inputs, target=t) the loss."""

    def __init__(self, model: nn.Module, loss: str):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args, target=None, **kwargs):
        logits = self.model(*args, **kwargs)
        if target is None:
            return logits
        if self.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits.squeeze(-1).float(), target)
        return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())


class DLRM(nn.Module):
    """DLRM as the seed talk builds it: a bottom MLP of the dense features, a table per sparse
    feature, the pairwise dot products of all these vectors, a top MLP to one logit."""

    def __init__(self, s):
        super().__init__()
        self.bottom = _mlp([s.dense, *s.mlp, s.dim], relu_last=True)
        self.tables = nn.ModuleList(nn.Embedding(s.rows, s.dim) for _ in range(s.tables))
        n = s.tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, 1), persistent=False)
        self.top = _mlp([s.dim + n * (n - 1) // 2, *s.mlp, 1], relu_last=False)

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        vectors = torch.stack([x, *(table(sparse[:, i]) for i, table in enumerate(self.tables))], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1))


def _mlp(sizes, relu_last: bool) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _gpt2(tf, s):
    config = tf.GPT2Config(
        n_embd=s.width, n_head=s.heads, n_layer=LAYERS, vocab_size=s.vocab, n_positions=max(1024, s.length),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    return Logits(tf.GPT2LMHeadModel(config))


def _bert(tf, s):
    config = tf.BertConfig(
        hidden_size=s.width, num_attention_heads=s.heads, intermediate_size=4 * s.width, num_hidden_layers=LAYERS,
        vocab_size=s.vocab, max_position_embeddings=max(512, s.length),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return Logits(tf.BertForMaskedLM(config))


def _llama(tf, s):
    config = tf.LlamaConfig(
        hidden_size=s.width, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        intermediate_size=s.hidden, num_hidden_layers=LAYERS, vocab_size=s.vocab,
        max_position_embeddings=max(4096, s.length), use_cache=False,
    )  # fmt: skip
    return Logits(tf.LlamaForCausalLM(config))


def _resnet(tv, s):
    if s.blocks is None:
        return tv.models.resnet50()
    return tv.models.ResNet(tv.models.resnet.Bottleneck, s.blocks, num_classes=s.classes)


def _dlrm(_, s):
    return DLRM(s)


def _tokens(s, batch, length, g):
    return (torch.randint(s.vocab, (batch, length), generator=g),), torch.randint(s.vocab, (batch, length), generator=g)


def _images(s, batch, length, g):
    images = torch.randn(batch, 3, s.image, s.image, generator=g).to(memory_format=torch.channels_last)
    return (images,), torch.randint(s.classes, (batch,), generator=g)


def _dlrm_inputs(s, batch, length, g):
    dense = torch.randn(batch, s.dense, generator=g)
    sparse = torch.randint(s.rows, (batch, s.tables), generator=g)
    return (dense, sparse), torch.randint(2, (batch,), generator=g).float()


@dataclass(frozen=True)
class Spec:
    """A model of the suite: the package it needs, its builder and inputs, its sizes real and tiny."""

    library: str | None  # a row is skipped where this does not import
    build: Callable  # (library, sizes) -> nn.Module giving logits
    inputs: Callable  # (sizes, batch, length, generator) -> (args, target), float32 / int64, on the CPU
    real: dict
    tiny: dict
    loss: str = "ce"  # "ce": cross-entropy over the last dim; "bce": binary, of one logit
    decoder: bool = False
    channels_last: bool = False

    def sizes(self, tiny: bool) -> SimpleNamespace:
        return SimpleNamespace(**(self.tiny if tiny else self.real))


_LM_TINY = dict(width=32, heads=4, kv_heads=2, hidden=64, vocab=128, batch=2, length=8)
MODELS = {
    "gpt2": Spec(
        "transformers", _gpt2, _tokens, dict(width=1024, heads=16, vocab=50257, batch=4, length=1024), _LM_TINY,
        decoder=True,
    ),
    "bert": Spec("transformers", _bert, _tokens, dict(width=768, heads=12, vocab=30522, batch=8, length=512), _LM_TINY),
    "llama": Spec(
        "transformers", _llama, _tokens,
        dict(width=2048, heads=16, kv_heads=4, hidden=5632, vocab=32000, batch=4, length=1024), _LM_TINY,
        decoder=True,
    ),
    "resnet50": Spec(
        "torchvision", _resnet, _images, dict(blocks=None, classes=1000, image=224, batch=64, length=None),
        dict(blocks=[1, 1, 1, 1], classes=10, image=32, batch=2, length=None), channels_last=True,
    ),
    "dlrm": Spec(
        None, _dlrm, _dlrm_inputs,
        dict(dense=13, tables=26, rows=100_000, dim=64, mlp=[512, 256], batch=8192, length=None),
        dict(dense=13, tables=4, rows=64, dim=8, mlp=[16, 8], batch=16, length=None), loss="bce",
    ),
}  # fmt: skip


def build_task(spec: Spec, library, s, step: str, device: str, dtype, reference: bool = False) -> Task:
    """The model with its loss, seeded, on the device in `dtype` (reference: float32 holding the
    same dtype-rounded weights), in train mode for `train` only."""
    torch.manual_seed(0)
    task = Task(spec.build(library, s), spec.loss).to(device, dtype)
    if reference:
        task = task.float()
    if spec.channels_last:
        task = task.to(memory_format=torch.channels_last)
    return task.train(step == "train")


def step_inputs(spec: Spec, s, step: str, task: Task, length, device: str, dtype, compute) -> tuple:
    """(args, kwargs, target: train only) of a step, floats rounded to `dtype` and held in `compute`;
    decode steps have batch 1 and one token (decode-static: a StaticCache filled eagerly up to S/2)."""
    g = torch.Generator().manual_seed(1)
    one = step.startswith("decode")
    args, target = spec.inputs(s, 1 if one else s.batch, 1 if one else length, g)
    args = tuple(a.to(dtype).to(device, compute) if a.is_floating_point() else a.to(device) for a in args)
    kwargs = static_cache(task, s, device, g) if step == "decode-static" else {}
    return args, kwargs, target.to(device) if step == "train" else None


def static_cache(task: Task, s, device: str, g) -> dict:
    import transformers

    lm = task.model.inner
    cache = transformers.StaticCache(config=lm.config, max_cache_len=s.length)
    prefix = s.length // 2
    with torch.no_grad():
        lm(
            input_ids=torch.randint(s.vocab, (1, prefix), generator=g).to(device),
            past_key_values=cache,
            cache_position=torch.arange(prefix, device=device),
            use_cache=True,
        )
    position = torch.tensor([prefix], device=device)
    return dict(past_key_values=cache, cache_position=position, position_ids=position[None], use_cache=True)


# ---------------------------------------------------------------- one row, in its own process


def emit(**record) -> None:
    print(PREFIX + json.dumps(record), flush=True)


def compiled(task: Task, variant: str):
    if variant == "eager":
        return task
    if variant == "inductor-ro":
        return torch.compile(task, mode="reduce-overhead")
    if variant in ("minicomp", "minicomp-graphs"):
        from minicomp.dispatch.dynamo import registered

        mode = "reduce-overhead" if variant == "minicomp-graphs" else None
        return torch.compile(task, backend=registered(), mode=mode)  # a source tree has no entry point
    return torch.compile(task, backend="inductor")


def make_step(task: Task, fn, step: str, args, kwargs, target) -> Callable:
    """One call of the step: train runs the loss and its backward, then sets the gradients to None
    (where an optimizer would have used them)."""
    if step == "train":

        def run():
            loss = fn(*args, target=target, **kwargs)
            loss.backward()
            task.zero_grad(set_to_none=True)
            return loss

        return run

    def run():
        with torch.no_grad():
            return fn(*args, **kwargs)

    return run


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_s(run, device: str):
    sync(device)
    start = time.perf_counter()
    out = run()
    sync(device)
    return time.perf_counter() - start, out


def median_ms(run, device: str) -> float:
    if device != "cuda":  # --tiny: one call's wall clock, a smoke value
        return timed_s(run, device)[0] * 1e3
    for _ in range(WARMUP):
        run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(TIMED)]
    for begin, end in events:
        begin.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def peak_mib(run, device: str) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def kernels(run, device: str) -> tuple[int | None, list]:
    """(GPU activities in one step, the 10 longest by name as [us, count, name]); on the CPU the
    profiler's ops by own time instead, and no count."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        run()
        sync(device)
    if cuda:
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        times = [(e.name, e.time_range.elapsed_us()) for e in events]
    else:
        times = [(e.name, e.self_cpu_time_total) for e in prof.events()]
    by_name: dict[str, list] = {}
    for name, us in times:
        total = by_name.setdefault(name, [0.0, 0])
        total[0] += us
        total[1] += 1
    top = sorted(([round(us, 1), n, name[:160]] for name, (us, n) in by_name.items()), reverse=True)[:10]
    return (len(times) if cuda else None), top


def sample(out) -> torch.Tensor:
    """At most SAMPLED evenly strided values of an output, float32 on the CPU: what errors compare."""
    flat = out.detach().float().flatten()
    return flat[:: max(1, flat.numel() // SAMPLED)].cpu()


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("nan")
    return (a.double() - b.double()).abs().max().item()


def child(job: dict) -> None:
    """One row: import, build, the first call, steady state, memory, profile, new lengths, errors."""
    spec, step, variant, tiny = MODELS[job["model"]], job["step"], job["variant"], job["tiny"]
    device, dtype = ("cpu", torch.float32) if tiny else ("cuda", torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            library = importlib.import_module(spec.library) if spec.library else None
        except Exception as err:  # noqa: BLE001 - a package built for another torch raises more than ImportError
            emit(status=f"skipped: {spec.library} does not import: {_first_line(err)}")
            return
        if variant != "eager":  # the compiler's import time is the row's import_s, not its first call's
            importlib.import_module("minicomp" if variant.startswith("minicomp") else "torch._inductor.compile_fx")

        emit(import_s=time.time() - job["spawned"], device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
        s = spec.sizes(tiny)
        start = time.perf_counter()
        task = build_task(spec, library, s, step, device, dtype)
        args, kwargs, target = step_inputs(spec, s, step, task, s.length, device, dtype, dtype)
        sync(device)
        emit(build_s=time.perf_counter() - start)
        fn = compiled(task, variant)
        run = make_step(task, fn, step, args, kwargs, target)
        first_s, out = timed_s(run, device)
        out = sample(out)
        emit(first_s=first_s, **_dynamo_counts(caught))
        emit(ms=median_ms(run, device), peak_mib=peak_mib(run, device))
        count, top = kernels(run, device)
        emit(kernels=count, top=top, **_dynamo_counts(caught))
        if step == "infer" and spec.decoder:
            emit(**new_lengths(spec, s, task, fn, device, dtype))
        del run, fn, task, args, kwargs, target
        emit(**errors(job, spec, library, s, out, device, dtype), **_dynamo_counts(caught))


def new_lengths(spec, s, task, fn, device, dtype) -> dict:
    """Seconds of an inference call at length S-1 (the second length), then at S-2 (the third)."""
    seconds = []
    for length in (s.length - 1, s.length - 2):
        args, kwargs, _ = step_inputs(spec, s, "infer", task, length, device, dtype, dtype)
        seconds.append(timed_s(make_step(task, fn, "infer", args, kwargs, None), device)[0])
    return dict(second_len_s=seconds[0], new_len_s=seconds[1])


def errors(job, spec, library, s, out: torch.Tensor, device: str, dtype) -> dict:
    """err and err_fp32 of this row's first output; the eager row computes and saves both references
    (its own output, and float32 eager's) for the rows after it."""
    path = Path(job["refs"]) / f"{job['model']}-{job['step']}.pt"
    if job["variant"] == "eager":
        if device == "cuda":
            torch.cuda.empty_cache()
        task = build_task(spec, library, s, job["step"], device, dtype, reference=True)
        args, kwargs, target = step_inputs(spec, s, job["step"], task, s.length, device, dtype, torch.float32)
        with torch.no_grad():
            reference = sample(task(*args, target=target, **kwargs))
        torch.save(dict(eager=out, fp32=reference), path)
    if not path.exists():
        return dict(err=None, err_fp32=None)
    refs = torch.load(path)
    return dict(err=max_error(out, refs["eager"]), err_fp32=max_error(out, refs["fp32"]))


def _dynamo_counts(caught) -> dict:
    from torch._dynamo.utils import counters

    said = (str(w.message).splitlines()[0][:300] for w in caught)
    fallbacks = list(dict.fromkeys(line for line in said if "minicomp could not" in line))
    return dict(
        graphs=counters["stats"]["unique_graphs"],
        graph_breaks=sum(counters["graph_break"].values()),
        fallbacks=fallbacks,
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


# ---------------------------------------------------------------- the suite: a process per row


def jobs(pairs, variants) -> list[dict]:
    """The rows of (model, step) pairs, eager first within each (the others' reference)."""
    out = []
    for model, step in pairs:
        if step.startswith("decode") and not MODELS[model].decoder:
            continue
        for variant in (v for v in VARIANTS if v in variants):
            if variant not in GRAPHED or step.startswith("decode"):
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
    command = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", __spec__.name, "--child"]
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
    """x_inductor (and x_inductor_ro) on minicomp rows: minicomp / Inductor of ms, first_s, peak_mib."""
    by_key = {(r["model"], r["step"], r["variant"]): r for r in rows}
    for row in rows:
        if row["variant"] not in ("minicomp", "minicomp-graphs"):
            continue
        for base, key in (("inductor", "x_inductor"), ("inductor-ro", "x_inductor_ro")):
            other = by_key.get((row["model"], row["step"], base), {})
            ratios = {m: row[m] / other[m] for m in ("ms", "first_s", "peak_mib") if row.get(m) and other.get(m)}
            if ratios:
                row[key] = ratios


COLUMNS = [
    ("model", "model"), ("step", "step"), ("variant", "variant"), ("ms", "ms"), ("x_inductor", "x Ind"),
    ("first_s", "first s"), ("import_s", "import s"), ("new_len_s", "new len s"), ("kernels", "kernels"),
    ("peak_mib", "peak MiB"), ("err", "err"), ("err_fp32", "err fp32"), ("status", "status"),
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
        return f"{value:.3g}" if key.startswith("err") else f"{value:.2f}"
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
    unknown = set(models) - set(MODELS) | set(steps) - set(STEPS) | set(variants) - set(VARIANTS)
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
    if sys.argv[1:2] == ["--child"]:
        child(json.loads(sys.argv[2]))
    else:
        main()
