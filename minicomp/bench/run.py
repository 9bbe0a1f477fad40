"""`minicomp bench`: check, time and report minicomp against eager, Inductor and the floor."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from minicomp.bench import measure, report
from minicomp.tools.workloads import WORKLOADS, bias_relu

PROBE = Path(__file__).with_name("compile_probe.py")  # run as a script: nothing of minicomp loads first
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_SIZES = {"rope_fw": 8, "rope_fwbw": 8}  # tiny shapes: the interpreter only checks results


def implementations(fn):
    import minicomp

    return {"eager": fn, "inductor": torch.compile(fn), "minicomp": minicomp.jit(fn)}


def check(impls, inputs, backward: bool, dtype) -> dict[str, str]:
    """Each implementation's result (and gradients) against a reference; a wrong result is never timed.

    float32: elementwise against eager, rtol 1e-4 and atol 1e-4 times the result's largest
    magnitude (long sums differ by summation order alone). float16/bfloat16: against eager run on
    float32 copies of the inputs, by relative error ||out - ref|| / ||ref||, below 1e-2 or twice
    eager's own error in that dtype, whichever is larger (eager itself rounds every op to 16 bits,
    so elementwise closeness to eager fails near cancellations for correct code). Why these
    bounds: docs/experiments.md."""
    low = dtype in (torch.bfloat16, torch.float16)
    reference_inputs = [
        i.detach().float().requires_grad_(i.requires_grad) if low and i.is_floating_point() else i for i in inputs
    ]
    expected, expected_grads = _run(impls["eager"], reference_inputs, backward)
    expected = expected + expected_grads
    bounds = [1e-2] * len(expected)
    if low:  # eager's own error in this dtype
        got, grads = _run(impls["eager"], inputs, backward)
        bounds = [max(1e-2, 2 * _relative_error(a, b)) for a, b in zip(got + grads, expected)]
    verdict = {}
    for name, fn in impls.items():
        try:
            got, grads = _run(fn, inputs, backward)
            for a, b, bound in zip(got + grads, expected, bounds):
                if low:
                    error = _relative_error(a, b)
                    assert error < bound, f"relative error {error:.2e} (bound {bound:.2e})"
                else:
                    scale = max(1.0, b.float().abs().max().item()) if b.numel() else 1.0
                    torch.testing.assert_close(a.float(), b.float(), atol=1e-4 * scale, rtol=1e-4)
            verdict[name] = "ok"
        except Exception as err:  # noqa: BLE001 - report, don't crash the run
            verdict[name] = f"WRONG: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return verdict


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _run(fn, inputs, backward):
    inputs = [i.detach().clone().requires_grad_(i.requires_grad) for i in inputs]
    outs = measure.flat_tensors(fn(*inputs))
    if not backward:
        return outs, []
    # the same random seeds for every implementation (ones would make softmax's gradient 0: every
    # result "wrong" by relative error); drawn in float32 on the CPU, so 16-bit runs round the same values
    torch.manual_seed(0)
    seeds = [torch.randn(o.shape, dtype=torch.float32).to(o) for o in outs]
    torch.autograd.backward(outs, seeds)
    return outs, [i.grad for i in inputs if i.requires_grad]


def parse(argv):
    p = argparse.ArgumentParser(
        prog="minicomp bench",
        description="Check every workload's result against eager, then time eager, Inductor and minicomp "
        "(GPU; on the CPU results are only checked) and write table.md, results.json/.csv and a plot per "
        "workload under OUT/<device>/. `minicomp bench models --help`: whole models (the model suite).",
    )
    p.add_argument(
        "--workloads",
        nargs="*",
        default=list(WORKLOADS),
        choices=list(WORKLOADS),
        metavar="NAME",
        help=f"default: all of {', '.join(WORKLOADS)}",
    )
    p.add_argument(
        "--dtypes",
        nargs="*",
        default=["float32", "bfloat16"],
        choices=list(DTYPES),
        metavar="DTYPE",
        help=f"default: float32 bfloat16; any of {', '.join(DTYPES)}",
    )
    p.add_argument("--sizes", nargs="*", type=int, help="override each workload's size sweep")
    p.add_argument("--out", default="benchmarks/results", help="folder; a subfolder per device is made")
    p.add_argument("--skip-compile-time", action="store_true", help="skip the fresh-process first-call rows")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["models"]:  # whole models: minicomp/bench/models.py
        from minicomp.bench.models import main as models

        models(argv[1:])
        return 0
    args = parse(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    out = Path(args.out) / device_name.replace(" ", "_")
    out.mkdir(parents=True, exist_ok=True)
    if not cuda:
        print("No CUDA GPU: checking results through Triton's interpreter only; timings are skipped.")
    bandwidth = measure.copy_bandwidth(device) if cuda else None
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if cuda else 0
    rows = []
    jobs = [
        (w, d, s)
        for w in args.workloads
        for d in args.dtypes
        for s in (args.sizes or WORKLOADS[w].sizes if cuda else [CPU_SIZES.get(w, 4)])
    ]
    for wname, dname, size in report.progress(jobs, "bench"):
        work, dtype = WORKLOADS[wname], DTYPES[dname]
        sets = measure.input_sets(work.make, size, dtype, device, l2) if cuda else [work.make(size, dtype, device)]
        impls = implementations(work.fn)
        verdict = check(impls, sets[0], work.backward, dtype)
        outputs = measure.flat_tensors(work.fn(*sets[0]))
        moved = measure.floor_bytes(sets[0], outputs, work.backward)
        copy_ms = measure.copy_ms(moved, device) if cuda else None  # what moving these bytes takes at this size
        for name, fn in impls.items():
            row = dict(workload=wname, dtype=dname, size=size, impl=name, check=verdict[name], bytes=moved)
            if cuda and verdict[name] == "ok":
                ms = measure.time_ms(fn, sets, work.backward)
                row["peak_mib"] = measure.peak_bytes(fn, sets[0], work.backward) / 2**20
                row.update(ms=ms, gbps=moved / (ms * 1e-3) / 1e9, floor_ms=moved / bandwidth * 1e3, copy_ms=copy_ms)
                row["x_floor"] = ms / row["floor_ms"]
                row["x_copy"] = ms / copy_ms
            rows.append(row)
    report.add_ratios(rows)
    extra = {
        "device": device_name,
        "torch": torch.__version__,
        "command": " ".join(["minicomp bench"] + (argv or sys.argv[2:])),
    }
    if cuda:
        extra["copy_bandwidth_gbps"] = bandwidth / 1e9
        extra["per_call_us"] = overhead()
        if not args.skip_compile_time:
            extra["compile_s"], extra["compile_breakdown"] = compile_times()
    report.write(out, rows, extra)
    print(report.markdown(rows, extra))
    return 0 if all(r["check"] == "ok" for r in rows) else 1


def overhead() -> dict[str, float]:
    """Per-call time of a tiny bias + ReLU (64 x 64): the launch-bound regime."""
    x, b = torch.randn(64, 64, device="cuda"), torch.randn(64, device="cuda")
    impls = implementations(bias_relu)
    result = {name: measure.per_call_us(fn, (x, b)) for name, fn in impls.items()}
    compiled = impls["minicomp"].compiled(x, b)
    result["minicomp call() alone"] = measure.per_call_us(compiled.call, (x, b))
    [kernel] = compiled.kernels  # the one kernel, launched bare through Triton
    launch = compiled.launch(kernel)
    block, warps = launch.config
    args = compiled.bare_arguments(kernel, [x, b])
    result["bare Triton launch (kernel[grid](...))"] = measure.per_call_us(
        lambda: launch.kernel[(launch.grid(block),)](*args, BLOCK_SIZE=block, num_warps=warps), ()
    )
    out = kernel.buffers.index(kernel.writes[0])  # where the output goes among the arguments
    result["bare Triton launch + torch.empty"] = measure.per_call_us(
        lambda: launch.kernel[(launch.grid(block),)](
            *args[:out], torch.empty_like(x), *args[out + 1 :], BLOCK_SIZE=block, num_warps=warps
        ),
        (),
    )
    return result


PHASES = (  # (row name, probe arguments); cold first: it fills the caches the warm rows read
    ("cold", []),
    ("warm", []),
    ("warm, new batch size", ["new-rows"]),
    ("warm, third sequence length", ["new-seq"]),
    ("block training step, cold", ["block"]),
    ("block training step, warm", ["block"]),
)


def probe_env(cache: str, pycache: str) -> dict[str, str]:
    """The environment of a probe: its own compiler caches under `cache`, and Python's bytecode
    cached under `pycache`, as an installed torch has it (a machine that sets
    PYTHONDONTWRITEBYTECODE would otherwise compile torch's sources again in every probe)."""
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=f"{cache}/mc",
        TORCHINDUCTOR_CACHE_DIR=f"{cache}/ind",
        TRITON_CACHE_DIR=f"{cache}/triton",
        PYTHONPYCACHEPREFIX=pycache,
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_probe(impl: str, extra: list[str], env: dict[str, str], device: str = "cuda") -> list[str]:
    """The probe's output lines (its last: seconds of the first call)."""
    out = subprocess.run(
        [sys.executable, str(PROBE), impl, device, *extra],  # by path: `-m` would import minicomp
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"compile probe {impl} {extra} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()


def compile_times() -> tuple[dict[str, float], dict[str, dict]]:
    """First call in a fresh process with empty caches (cold), then again with them filled (warm),
    counting `import minicomp` (and Inductor's import of torch._dynamo) in both clocks; the decoder
    block's training step through torch.compile the same way. One untimed run of the block with
    each compiler first fills Python's bytecode cache."""
    times, breakdowns = {}, {}
    with tempfile.TemporaryDirectory() as pycache:
        for impl in ("minicomp", "inductor"):
            with tempfile.TemporaryDirectory() as scratch:
                run_probe(impl, ["block"], probe_env(scratch, pycache))
        for impl in ("minicomp", "inductor"):
            with tempfile.TemporaryDirectory() as cache:
                env = probe_env(cache, pycache)
                for phase, extra in PHASES:
                    lines = run_probe(impl, extra, env)
                    times[f"{impl} {phase}"] = float(lines[-1])
                    if len(lines) > 1 and lines[-2].startswith("{") and json.loads(lines[-2]):
                        breakdowns[f"{impl} {phase}"] = json.loads(lines[-2])
    return times, breakdowns
