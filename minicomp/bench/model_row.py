"""One row of the model suite in a process of its own (minicomp/bench/models.py starts it):
import, build, the first call, steady state, memory, profile, new lengths, errors, each printed as
a `SUITE {json}` line as it comes, so a crash or a timeout loses only what the row had not reached.

    python -m minicomp.bench.model_row '{"model": "gpt2", "step": "train", ...}'
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from minicomp.bench.model_specs import MODELS, Task, build_task, rewinding, step_inputs

PREFIX = "SUITE "  # the child's result lines; everything else it prints is ignored
WARMUP, TIMED, SAMPLED = 10, 30, 1 << 20


def emit(**record) -> None:
    print(PREFIX + json.dumps(record), flush=True)


def compiled(task: Task, variant: str):
    if variant == "eager":
        return task
    if variant == "aot_eager":
        return torch.compile(task, backend="aot_eager")
    if variant == "inductor-ro":
        return torch.compile(task, mode="reduce-overhead")
    base, _, settings = variant.partition(":")
    if base in ("minicomp", "minicomp-graphs"):
        from minicomp.dispatch.dynamo import registered

        mode = "reduce-overhead" if base == "minicomp-graphs" else None
        options = {k: _value(v) for k, v in _pairs(settings)} or None
        return torch.compile(task, backend=registered(), mode=mode, options=options)  # (a source tree: no entry point)
    return torch.compile(task, backend="inductor")


def _pairs(settings: str) -> list[tuple[str, str]]:
    """ "a=1+b=x" -> [("a", "1"), ("b", "x")]: a variant's options (`minicomp:chunk_budget_bytes=134217728`;
    `+` joins them, as the suite's --variants splits on commas)."""
    return [tuple(item.split("=", 1)) for item in settings.split("+") if item]


def _value(text: str):
    """An option's value as written after `=`: an int, a float, true/false, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


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

    return rewinding(run, kwargs)


def real_step(name: str, step: str, variant: str) -> Callable:
    """One call of a suite model's `step` at its real sizes on the GPU in bf16, compiled by `variant`
    (the GPU scripts' setup: benchmarks/scripts/)."""
    spec, bf16 = MODELS[name], torch.bfloat16
    sizes = spec.sizes(False)
    library = importlib.import_module(spec.library) if spec.library else None
    task = build_task(spec, library, sizes, step, "cuda", bf16)
    args, kwargs, target = step_inputs(spec, sizes, step, task, sizes.length, "cuda", bf16, bf16)
    return make_step(task, compiled(task, variant), step, args, kwargs, target)


def profiled(run: Callable, steps: int, each_synchronized: bool):
    """torch.profiler (CPU and CUDA) over `steps` calls of `run`, each in a "one_step" range, after
    8 warm calls; synchronized after each call or only after the last (back to back)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(8):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with record_function("one_step"):
                run()
                if each_synchronized:
                    torch.cuda.synchronize()
        torch.cuda.synchronize()
    return prof


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


def held(device: str) -> tuple[int, int] | None:
    """(bytes allocated, bytes reserved) by torch's CUDA allocator now."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def held_mib(before, after) -> dict:
    """What the compiled step keeps between calls, after its warm-up and timed steps, above what was
    held before it was compiled: its CUDA graphs' memory pool (allocated: the graphs' outputs and
    buffers; reserved: the pool's whole segments), cached workspaces."""
    if before is None:
        return {}
    return dict(held_mib=(after[0] - before[0]) / 2**20, held_reserved_mib=(after[1] - before[1]) / 2**20)


def kernels(run, device: str) -> tuple[int | None, list, float | None]:
    """(GPU activities in one step, the 10 longest by name as [us, count, name], the ms the GPU
    was busy: the union of their time ranges); on the CPU the profiler's ops by own time instead,
    no count and no busy time."""
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
    if not cuda:
        return None, top, None
    return len(times), top, busy_ms([(e.time_range.start, e.time_range.end) for e in events])


def busy_ms(ranges: list[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one of the (start, end) ranges in microseconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(ranges):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e3


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
        before = held(device)
        fn = compiled(task, variant)
        run = make_step(task, fn, step, args, kwargs, target)
        first_s, out = timed_s(run, device)
        out = sample(out)
        emit(first_s=first_s, **_dynamo_counts(caught))
        second_s, _ = timed_s(run, device)
        emit(second_s=second_s)
        ms = median_ms(run, device)
        emit(ms=ms, peak_mib=peak_mib(run, device))
        emit(**held_mib(before, held(device)))
        count, top, busy = kernels(run, device)
        emit(kernels=count, top=top, **_dynamo_counts(caught))
        if busy is not None:  # the rest of a step is the host's: launches, Python, allocation
            emit(gpu_ms=busy, host_ms=max(0.0, ms - busy))
        if step == "infer" and spec.decoder:
            emit(**new_lengths(spec, s, task, fn, device, dtype))
        grads = gradients(task, fn, args, kwargs, target) if step == "train" else None
        del run, fn, task, args, kwargs, target
        emit(**errors(job, spec, library, s, out, grads, device, dtype), **_dynamo_counts(caught))


def new_lengths(spec, s, task, fn, device, dtype) -> dict:
    """Seconds of an inference call at length S-1 (the second length), then at S-2 (the third)."""
    seconds = []
    for length in (s.length - 1, s.length - 2):
        args, kwargs, _ = step_inputs(spec, s, "infer", task, length, device, dtype, dtype)
        seconds.append(timed_s(make_step(task, fn, "infer", args, kwargs, None), device)[0])
    return dict(second_len_s=seconds[0], new_len_s=seconds[1])


def gradients(task: Task, fn, args, kwargs, target) -> list:
    """A `sample` of each parameter's gradient after one training step (None where it has none)."""
    fn(*args, target=target, **kwargs).backward()
    grads = [None if p.grad is None else sample(p.grad) for p in task.parameters()]
    task.zero_grad(set_to_none=True)
    return grads


def errors(job, spec, library, s, out: torch.Tensor, grads: list | None, device: str, dtype) -> dict:
    """err and err_fp32 of this row's first output, err_mean_fp32 its mean error, and for a training
    step grad_err_fp32 (`relative_error` of the gradients); the eager row computes and saves the
    references (its own output, and float32 eager's output and gradients) for the rows after it."""
    path = Path(job["refs"]) / f"{job['model']}-{job['step']}.pt"
    if job["variant"] == "eager":
        if device == "cuda":
            torch.cuda.empty_cache()
        task = build_task(spec, library, s, job["step"], device, dtype, reference=True)
        args, kwargs, target = step_inputs(spec, s, job["step"], task, s.length, device, dtype, torch.float32)
        if grads is None:
            with torch.no_grad():
                reference, reference_grads = sample(task(*args, target=target, **kwargs)), None
        else:
            reference = sample(task(*args, target=target, **kwargs))
            reference_grads = gradients(task, task, args, kwargs, target)
        torch.save(dict(eager=out, fp32=reference, grads_fp32=reference_grads), path)
    if not path.exists():
        return dict(err=None, err_fp32=None)
    refs = torch.load(path)
    found = dict(
        err=max_error(out, refs["eager"]),
        err_fp32=max_error(out, refs["fp32"]),
        err_mean_fp32=mean_error(out, refs["fp32"]),
    )
    if grads is not None and refs.get("grads_fp32") is not None:
        found["grad_err_fp32"] = relative_error(grads, refs["grads_fp32"])
    return found


def mean_error(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("nan")
    return (a.double() - b.double()).abs().mean().item()


def relative_error(grads: list, references: list) -> float:
    """The median over parameters of sum|g - reference| / sum|reference|: one number per training
    step whose noise averages out (a scalar loss's error is a single draw: with per-token errors of
    about e, its error is about e / sqrt(tokens) whatever the compiler; docs/experiments.md). The
    median, as a gradient that is zero but for rounding (an attention key's bias) has a relative
    error in the hundreds."""
    errors = [
        ((g.double() - r.double()).abs().sum() / r.double().abs().sum().clamp_min(1e-30)).item()
        for g, r in zip(grads, references, strict=True)
        if g is not None and r is not None and g.shape == r.shape
    ]
    return statistics.median(errors) if errors else float("nan")


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


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
