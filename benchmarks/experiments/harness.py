"""What every experiment shares: its command line, timing on either device, kernels from text.

Every experiment runs from the repository root as a module and writes JSON:

    python -m benchmarks.experiments.<name> OUT.json            # the measurement (a GPU)
    TRITON_INTERPRET=1 python -m benchmarks.experiments.<name> OUT.json --tiny
                                                                # the same code on tiny CPU tensors

`--tiny` is what tests/test_experiments.py runs, so every script keeps working;
its numbers mean nothing. TRITON_INTERPRET=1 makes the scripts' own
@triton.jit kernels run in Triton's interpreter, as minicomp's do on the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass

import torch

import minicomp
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS, rope


@dataclass
class Run:
    out: str
    tiny: bool

    @property
    def device(self) -> str:
        return "cpu" if self.tiny else "cuda"

    def bandwidth(self) -> float:
        """Copy bandwidth (bytes/s, read + written): the memory floor's denominator."""
        if self.tiny:
            src = torch.randn(1 << 16)
            return 2 * src.numel() * 4 / max(cpu_ms(lambda: src.clone(), []) * 1e-3, 1e-9)
        return measure.copy_bandwidth("cuda")

    def rope_inputs(self, requires_grad: bool = True):
        """make(seq, dtype, device) of RoPE's q, k, cos, sin: the benchmark's [8, 32, S, 128], or
        [1, 2, S, 128] when tiny (the head dim, which the kernels' text depends on, is kept)."""
        if not self.tiny:
            return WORKLOADS["rope_fwbw" if requires_grad else "rope_fw"].make

        def make(seq, dtype, device):
            q, k = (
                torch.randn(1, 2, seq, 128, dtype=dtype, device=device, requires_grad=requires_grad) for _ in range(2)
            )
            return [
                q,
                k,
                torch.randn(seq, 128, dtype=dtype, device=device),
                torch.randn(seq, 128, dtype=dtype, device=device),
            ]

        return make

    def input_sets(self, make, size, dtype) -> list[list]:
        l2 = 0 if self.tiny else torch.cuda.get_device_properties(0).L2_cache_size
        return measure.input_sets(make, size, dtype, self.device, l2)

    def time_ms(self, fn, sets, backward: bool = False) -> float:
        """Median ms of fn over rotating input sets (minicomp bench's method on the GPU)."""
        if self.tiny:

            def step(*inputs):
                outs = measure.flat_tensors(fn(*inputs))
                if backward:
                    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

            return cpu_ms(step, sets)
        return measure.time_ms(fn, sets, backward)

    def bench(self, run, sets) -> float:
        """Median ms of `run(*set)` over rotating sets (do_bench on the GPU)."""
        if self.tiny:
            return cpu_ms(run, sets)
        import triton.testing

        cycle = itertools.cycle(sets)
        return triton.testing.do_bench(lambda: run(*next(cycle)), warmup=25, rep=200, return_mode="median")

    def device_name(self) -> str:
        return "cpu (--tiny: not a measurement)" if self.tiny else torch.cuda.get_device_name()

    def write(self, **data) -> None:
        with open(self.out, "w") as f:
            json.dump(dict(device=self.device_name(), **data), f, indent=1)


def parse(argv, doc: str) -> Run:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="where the JSON results go")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny CPU tensors through Triton's interpreter (set TRITON_INTERPRET=1): a smoke run",
    )
    args = parser.parse_args(argv)
    if args.tiny and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--tiny runs the experiment's own kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    return Run(args.out, args.tiny)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64: a variant's output against the reference's."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def cpu_ms(fn, sets, calls: int = 1) -> float:
    """ms a call of `fn` on the CPU (a tiny run's: it only shows the path runs, so one call)."""
    cycle = itertools.cycle(sets or [[]])
    start = time.perf_counter()
    for _ in range(calls):
        fn(*next(cycle))
    return (time.perf_counter() - start) / calls * 1e3


def kernel_from_text(kernel_source: str, name: str, transform=lambda s: s):
    """Import `transform(kernel_source)` (a @triton.jit function's source) as a kernel:
    Triton reads a kernel's source from its file, so the text goes to one first."""
    text = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n" + transform(
        kernel_source
    )
    path = tempfile.NamedTemporaryFile("w", suffix=f"_{re.sub(r'[^A-Za-z0-9_]', '_', name)}.py", delete=False)
    path.write(text)
    path.close()
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(text))}", path.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, re.search(r"^def (\w+)", kernel_source, re.M).group(1))


def lone_pointwise(compiled):
    """(call, launch, text) of a module's one pointwise kernel launched alone (its @triton.jit
    source, decorator included), or None for anything else (several kernels, a reduction, a
    combined launch)."""
    if len(compiled.kernels) != 1 or "n_elements" not in compiled.source:
        return None
    call = compiled.kernels[0]
    launch = compiled.launch(call)
    if getattr(launch, "pieces", None):
        return None
    text = getattr(launch.kernel, "src", None) or inspect.getsource(launch.kernel.fn)
    return call, launch, text if text.lstrip().startswith("@") else "@triton.jit\n" + text


def written(call, args, run) -> list[torch.Tensor]:
    """Copies of the outputs `run(*args)` writes into the kernel `call`'s output buffers, each
    filled with NaN first: an element a variant leaves unwritten shows in its error."""
    for buffer, name in zip(args, call.buffers):
        if name in call.writes:
            buffer.fill_(float("nan"))
    run(*args)
    return [buffer.clone() for buffer, name in zip(args, call.buffers) if name in call.writes]


def error_against(outs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """A variant's largest relative error over its outputs against the reference's."""
    return max(relative_error(a, b) for a, b in zip(outs, reference))


def time_in_turn(run: Run, cases, rounds: int) -> list[dict]:
    """`cases` of (row, go, sets) timed in turn (so clocks and neighbours treat them alike),
    `rounds` rounds (one when tiny), the least kept as row["ms"] with row["x_floor"] over
    row["floor_ms"]; each row printed. The rows, in order."""
    for _ in range(1 if run.tiny else rounds):
        for row, go, sets in cases:
            row["ms"] = min(row.get("ms", float("inf")), run.bench(go, sets))
    for row, _, _ in cases:
        row["x_floor"] = row["ms"] / row["floor_ms"]
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return [row for row, _, _ in cases]


def rope_modules(inputs, max_parts: int | None = None):
    """(forward, backward) `Compiled` of RoPE on `inputs` (q, k requiring grad), as minicomp writes
    them with config max_parts (its default when None), in a fresh cache: nothing served from an
    earlier write."""
    fresh_cache()
    settings = {} if max_parts is None else {"max_parts": max_parts}
    with config.override(**settings):
        fn = minicomp.jit(rope)
        entry = fn.entry(*inputs)
        torch.autograd.backward(fn(*inputs), [torch.ones_like(inputs[0])] * 2)  # compiles the backward
    return entry.forward, entry.backward


def fresh_cache() -> None:
    """A new, empty minicomp cache for what follows (no module, entry or tuning record reused)."""
    os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()


def bare(compiled):
    """`run(*graph inputs, block=, warps=, kernel=None) -> outputs`: the one kernel of a generated
    module launched through Triton's JIT at a chosen configuration, its arguments from the public
    accessors (Compiled.kernels, Compiled.bare_arguments). `kernel` replaces the @triton.jit
    function (a variant of its text, same parameters)."""
    [call] = compiled.kernels
    launch = compiled.launch(call)

    def run(*inputs, block, warps, kernel=None):
        args = compiled.bare_arguments(call, list(inputs))
        (kernel or launch.kernel)[(launch.grid(block),)](*args, BLOCK_SIZE=block, num_warps=warps)
        return [args[call.buffers.index(name)] for name in call.writes]

    run.launch = launch
    return run
