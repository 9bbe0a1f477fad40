"""Hand-edited variants of the norm backward's row-group kernel, timed: what a codegen change would buy.

    python -m benchmarks.experiments.norm_backward_variants OUT.json

The backward of RMSNorm and LayerNorm (bf16, [32768, 4096]: the bench's headline) is one kernel that
writes dx and, per group of rows, partial column sums for dW (and dB) (split_reductions.py), then a
small kernel that adds the partial rows. This launches the first kernel bare, as minicomp writes it
and with edits of its text:
- `plain range` / `num_stages=N`: the loop over a group's rows as Python's `range` (Triton's
  default pipelining) or `tl.range(..., num_stages=N)` instead of the text's;
- `R rows`: a group of R rows instead of the text's (more or fewer programs, partial rows);
- `evict_first tiles`: the loads of x and dy tiles with `eviction_policy='evict_first'`.
Each is timed two ways, the variants in turn, ROUNDS times, the least kept: `ms` as the bench times
(do_bench: an L2 flush before each run), `events_ms` as the launch tuner times (back to back behind
a GPU sleep); against the floor of what this kernel must move (read x, dy, w and what the forward
saved; write dx and the partial rows). `error_vs_written`: each variant's outputs against the
first's. A measurement aid only; minicomp emits the plain text.
"""

from __future__ import annotations

import inspect
import re
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments.reduction_variants import edits, helpers
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

GROUP = re.compile(r"xstart = pid \* (\d+)")
LOOP = re.compile(r"(?:tl\.)?range\((0, \d+, XBLOCK)(?:, num_stages=\d+)?\)")  # the loop over a group's rows


def group_rows(rows: int):
    """Each program takes `rows` rows (the text's group size replaced)."""

    def apply(text: str) -> str:
        old = GROUP.search(text).group(1)
        text = text.replace(f"xstart = pid * {old}", f"xstart = pid * {rows}")
        text = text.replace(f"range(0, {old}, XBLOCK", f"range(0, {rows}, XBLOCK")
        return text.replace(f"tl.arange(0, XBLOCK)[:, None] < {old})", f"tl.arange(0, XBLOCK)[:, None] < {rows})")

    return apply


def stages(n: int | None):
    """The loop over a group's rows with num_stages=n (None: a plain `range`, Triton's default)."""

    def apply(text: str) -> str:
        loop = LOOP.search(text)
        return text.replace(
            loop.group(0), f"range({loop.group(1)})" if n is None else f"tl.range({loop.group(1)}, num_stages={n})"
        )

    return apply


TILE_LOAD = re.compile(r"(tl\.load\(\w+_ptr \+ \(\d+\*x0 \+ r0\), mask=xmask & rmask, other=0)\)")


def evict_first(text: str) -> str:
    """The loads of a row tile (x, dy: read once here) hinted `evict_first`: the L2 keeps what else it holds."""
    edited, count = TILE_LOAD.subn(r"\1, eviction_policy='evict_first')", text)
    if not count:
        raise ValueError("no row tile's load found in the kernel's text")
    return edited


# (variant, edit, rows a group (None: as written), XBLOCK, warps[, other launch options])
VARIANTS = [
    ("as written", None, None, 2, 4),
    ("as written", None, None, 1, 8),
    ("as written", None, None, 4, 8),
    ("plain range", stages(None), None, 2, 4),
    ("plain range", stages(None), None, 1, 8),
    ("num_stages=2", stages(2), None, 2, 4),
    ("num_stages=3", stages(3), None, 2, 4),
    ("num_stages=1", stages(1), None, 2, 4),
    ("64 rows", None, 64, 2, 4),
    ("32 rows", None, 32, 2, 4),
    ("64 rows, plain range", stages(None), 64, 2, 4),
    ("evict_first tiles", evict_first, None, 2, 4),
    ("evict_first tiles", evict_first, None, 1, 8),
    ("evict_first tiles", evict_first, None, 4, 8),
    # more rows in flight a program, or more programs a SM (fewer registers each)
    ("num_stages=2", stages(2), None, 1, 4),
    ("num_stages=3", stages(3), None, 1, 4),
    ("num_stages=4", stages(4), None, 1, 4),
    ("num_stages=3", stages(3), None, 1, 2),
    ("num_stages=2", stages(2), None, 2, 8),
    ("num_stages=3", stages(3), None, 4, 8),
    ("num_stages=2, maxnreg=128", stages(2), None, 2, 4, {"maxnreg": 128}),
    ("num_stages=2, maxnreg=96", stages(2), None, 1, 4, {"maxnreg": 96}),
    ("num_stages=3, maxnreg=128", stages(3), None, 1, 4, {"maxnreg": 128}),
]
TINY_VARIANTS = [
    ("as written", None, None, 1, 1),
    ("4 rows, plain range", stages(None), 4, 1, 1),
    ("evict_first tiles", evict_first, None, 1, 1),
]
ROUNDS = 2  # the variants timed in turn, this many times; the least time kept


def backward_kernel(work, inputs):
    """(backward Compiled, its first kernel call, the backward's graph inputs) of `work` on `inputs`."""
    jit = minicomp.jit(work.fn)
    out = jit(*inputs)
    out.backward(torch.randn_like(out))
    entry = jit.entry(*inputs)
    forward, backward = entry.forward, entry.backward
    values = dict(zip(forward.graph.outputs, forward.call(*[i.detach() for i in inputs])))
    values.update({f"primals_{k + 1}": t.detach() for k, t in enumerate(inputs)})
    values["tangents_1"] = torch.randn_like(out)
    return backward, backward.kernels[0], [values[name] for name in backward.graph.inputs]


def _results(buffers, args) -> list[torch.Tensor]:
    """What the kernel computed: each output (the partial rows summed, so groups of any size compare)."""
    outs = []
    for name, value in zip(buffers, args):
        if name.endswith("_partial"):
            outs.append(value.sum(0))
        elif not name.startswith(("primals", "tangents")) and isinstance(value, torch.Tensor) and value.ndim > 1:
            outs.append(value.clone())
    return outs


def events_ms(run, args, runs: int = 15) -> float:
    """The tuner's way (launch.py `_time`): runs back to back behind a GPU sleep, CUDA events around
    each, no L2 flush between them; the median."""
    run(*args)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    torch.cuda._sleep(100_000_000)
    for start, end in pairs:
        start.record()
        run(*args)
        end.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in pairs)[runs // 2]


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    size, dtype = (4, torch.float32) if run.tiny else (32768, torch.bfloat16)  # (tiny: each row interpreted)
    rows = []
    for wname in ("rms_norm_fwbw",) if run.tiny else ("rms_norm_fwbw", "layer_norm_fwbw"):
        work = WORKLOADS[wname]
        sets = run.input_sets(work.make, size, dtype)
        harness.fresh_cache()
        backward, call, graph_inputs = backward_kernel(work, sets[0])
        launch = backward.launch(call)
        text = getattr(launch.kernel, "src", None) or inspect.getsource(launch.kernel.fn)
        text = text if text.lstrip().startswith("@") else "@triton.jit\n" + text
        written = int(GROUP.search(text).group(1))
        base = backward.bare_arguments(call, graph_inputs)
        print(wname, "arguments", call.buffers, "group", written, flush=True)
        reference, cases = None, []
        for name, edit, group, xblock, warps, *options in TINY_VARIANTS if run.tiny else VARIANTS:
            options = options[0] if options else {}
            group = group or written
            programs = -(-size // group)
            args = list(base)
            for i, buffer in enumerate(call.buffers):  # fresh partial rows for this many groups
                if buffer.endswith("_partial"):
                    args[i] = torch.empty(programs, base[i].shape[-1], dtype=base[i].dtype, device=base[i].device)
            kernel = launch.kernel
            if edit is not None or group != written:
                edited = edits(edit or (lambda s: s), group_rows(group))(text)
                kernel = harness.kernel_from_text(edited + "\n\n\n" + helpers(backward.source), name)
            go = lambda *a, k=kernel, grid=(programs,), xb=xblock, w=warps, o=options: k[grid](  # noqa: E731
                *a, XBLOCK=xb, num_warps=w, **o
            )
            go(*args)
            results = _results(call.buffers, args)
            reference = reference or results
            error = max(harness.relative_error(a, b) for a, b in zip(results, reference))
            row = dict(
                workload=wname,
                variant=name,
                rows_a_group=group,
                programs=programs,
                xblock=xblock,
                warps=warps,
                options=options,
                error_vs_written=error,
                floor_ms=measure.tensor_bytes(args) / bandwidth * 1e3,
            )
            cases.append((row, go, args))
        for _ in range(1 if run.tiny else ROUNDS):  # in turn, so that clocks and neighbours treat them alike
            for row, go, args in cases:
                ms = run.bench(go, [args])
                row["ms"] = min(row.get("ms", float("inf")), ms)
                if not run.tiny:
                    row["events_ms"] = min(row.get("events_ms", float("inf")), events_ms(go, args))
        for row, _, _ in cases:
            row["x_floor"] = row["ms"] / row["floor_ms"]
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    run.write(size=size, dtype=str(dtype), bandwidth_gbps=bandwidth / 1e9, rounds=ROUNDS, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
