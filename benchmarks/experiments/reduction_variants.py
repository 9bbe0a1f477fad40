"""Hand-edited variants of generated reduction kernels, timed: what a codegen change would buy.

    python -m benchmarks.experiments.reduction_variants OUT.json

For the headline cross-entropy (bf16, [8192, 32000]) and RMSNorm (fp32,
[32768, 4096]), the first reduction kernel minicomp writes is launched bare
(its own arguments, a fixed XBLOCK and warp count) as written and with edits of its text:
for cross-entropy a sum kept per lane, the select of `_exp_shift` on the row's max, -inf in the
lanes past the row, exp as exp2 (folded, or flushing subnormals), the last partial block peeled
off the loop; for RMSNorm the looped form with Inductor's eviction hints, against the row held
whole. Timed as the bench times
(median of do_bench over input sets rotating past L2), against the memory floor
of the whole workload. A measurement aid only; minicomp emits the plain text.

The cross-entropy edits were written against the kernel text of commit 31d2a2e (before the
online max's -inf fill and `_exp_shift`'s exp2 of session 12, which adopted two of them); to
measure them again, run the script against that tree:

    git archive 31d2a2e minicomp | tar -x -C prev_tree
    PYTHONPATH=prev_tree:. python -P -m benchmarks.experiments.reduction_variants OUT.json

Against today's text an edit whose target is gone is reported and skipped.
"""

from __future__ import annotations

import inspect
import re
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

# (workload, dtype, size, config, [(variant, edit of the kernel text, XBLOCK, warps)])
CE_LOOP = re.compile(r"for roffset in range\((\d+), (\d+), RBLOCK\)")


def hint(name: str, policy: str):
    """An edit: the load assigned to `name` gets eviction_policy=policy."""
    pattern = re.compile(rf"(\n\s*{name} = tl\.load\(.*?, other=[^)]*)\)")
    return lambda s: pattern.sub(rf"\1, eviction_policy='{policy}')", s, count=1)


def edits(*steps):
    """Several edits, in order."""

    def apply(s):
        for step in steps:
            s = step(s)
        return s

    return apply


def swap(old: str, new: str):
    def apply(s):
        assert old in s, old
        return s.replace(old, new)

    return apply


# cross-entropy's online max-and-sum: the sum kept per lane ([XBLOCK, RBLOCK]) and reduced once after
# the loop, so a step has one cross-warp reduction (the max) instead of two
LANE_SUM = edits(
    swap("sum_1_acc = tl.full([XBLOCK, 1], 0.0, tl.float32)", "sum_1_acc = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)"),
    swap(
        "+ tl.reduce(_exp_shift(amax_block, amax_next), 1, _sum)[:, None]",
        "+ _exp_shift(amax_block, amax_next)",
    ),
    swap(
        'sum_1 = tl.where(amax == float("-inf"), float("nan"), sum_1_acc)',
        'sum_1 = tl.where(amax == float("-inf"), float("nan"), tl.reduce(sum_1_acc, 1, _sum)[:, None])',
    ),
)
# ... exp(x - m) with the select on the row's max (a scalar a row) instead of on every element
SAFE_SHIFT = swap(
    "_exp_shift(amax_block, amax_next)",
    'tl.exp(amax_block - tl.where(amax_next == float("-inf"), 0.0, amax_next))',
)
# ... masked lanes loaded as -inf, so no select for the max
LOAD_NEG_INF = edits(
    lambda s: re.sub(
        r"(logits = tl\.load\(logits_ptr \+ \(\d+\*x0 \+ r0\), mask=xmask & rmask, )other=0\)",
        r'\1other=float("-inf"))',
        s,
        count=1,
    ),
    swap('amax_block = tl.where(rmask, logits, float("-inf"))', "amax_block = logits"),
)
# ... exp as exp2 with log2(e) folded into one multiply-add
EXP2 = swap(
    'tl.exp(amax_block - tl.where(amax_next == float("-inf"), 0.0, amax_next))',
    "tl.math.exp2(amax_block * 1.4426950408889634"
    ' - tl.where(amax_next == float("-inf"), 0.0, amax_next) * 1.4426950408889634)',
)
# ... exp(x - m) as tl.exp computes it (x - m, times log2(e), ex2.approx) but flushing subnormal results to 0
# (ex2.approx.ftz: no range fix-up around the MUFU op); in a sum that holds exp(max - max) = 1 they are lost anyway
EXP_FTZ = swap(
    'tl.exp(amax_block - tl.where(amax_next == float("-inf"), 0.0, amax_next))',
    'tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r",'
    ' [(amax_block - tl.where(amax_next == float("-inf"), 0.0, amax_next)) * 1.4426950408889634],'
    " dtype=tl.float32, is_pure=True, pack=1)",
)


def peel(s: str) -> str:
    """The first looped pass split: its full blocks with no row mask, then the last, partial block."""
    head = re.search(r"\n(    for roffset in range\(0, (\d+), RBLOCK\):[^\n]*)\n((?:        [^\n]*\n)+)", s)
    n, body = int(head.group(2)), head.group(3)
    full = body.replace(f"rmask = rindex < {n}", "rmask = tl.full([1, RBLOCK], True, tl.int1)")
    last = f"    if {n} % RBLOCK:  # the last, partial block\n        roffset = {n} - {n} % RBLOCK\n" + body
    loop = f"\n    for roffset in range(0, {n} - {n} % RBLOCK, RBLOCK):  # full blocks: no row mask\n"
    return s[: head.start()] + loop + full + last + s[head.end() :]


BLOCK_2048 = swap("RBLOCK: tl.constexpr = 4096", "RBLOCK: tl.constexpr = 2048")
LEAN = edits(LANE_SUM, SAFE_SHIFT, LOAD_NEG_INF)
SHIFT_LOADS = edits(SAFE_SHIFT, LOAD_NEG_INF)
# RMSNorm looped in two passes with Inductor's eviction hints: x kept in L2 by the first pass, read
# for the last time by the second; the weight (the same for every row) kept
EVICT = edits(hint("x", "evict_last"), hint("w", "evict_last"), hint("x_1", "evict_first"))
CASES = [
    (
        "cross_entropy",
        torch.bfloat16,
        8192,
        dict(loop_block=4096),
        [
            ("as written", None, 1, 4),
            ("as written, 2 rows", None, 2, 4),
            ("lean (lane sum, safe shift, -inf loads)", LEAN, 1, 4),
            ("safe shift, -inf loads", SHIFT_LOADS, 1, 4),
            ("safe shift, -inf loads, exp2 folded", edits(SHIFT_LOADS, EXP2), 1, 4),
            ("safe shift, -inf loads, exp ftz", edits(SHIFT_LOADS, EXP_FTZ), 1, 4),
            ("safe shift, -inf loads, peeled", edits(SHIFT_LOADS, peel), 1, 4),
            ("safe shift, -inf loads, peeled, 2 rows", edits(SHIFT_LOADS, peel), 2, 4),
            ("safe shift, -inf loads, peeled, exp ftz", edits(SHIFT_LOADS, EXP_FTZ, peel), 1, 4),
            ("safe shift, -inf loads, peeled, exp ftz, 2 rows", edits(SHIFT_LOADS, EXP_FTZ, peel), 2, 4),
            ("safe shift, -inf loads, peeled, exp ftz, 8 warps", edits(SHIFT_LOADS, EXP_FTZ, peel), 1, 8),
            ("safe shift, -inf loads, peeled, exp2 folded", edits(SHIFT_LOADS, EXP2, peel), 1, 4),
            ("peeled", peel, 1, 4),
        ],
    ),
    (
        "cross_entropy_128k",
        torch.bfloat16,
        4096,
        dict(loop_block=4096),
        [
            ("as written", None, 1, 4),
            ("as written, 2 rows", None, 2, 4),
            ("safe shift, -inf loads, peeled", edits(SHIFT_LOADS, peel), 1, 4),
            ("safe shift, -inf loads, peeled, exp ftz", edits(SHIFT_LOADS, EXP_FTZ, peel), 1, 4),
            ("safe shift, -inf loads, peeled, exp ftz, 2 rows", edits(SHIFT_LOADS, EXP_FTZ, peel), 2, 4),
            ("safe shift, -inf loads, peeled, exp2 folded", edits(SHIFT_LOADS, EXP2, peel), 1, 4),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        32768,
        {},
        [
            ("as written", None, 2, 32),
            ("as written, 1 row", None, 1, 16),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        32768,
        dict(persistent_rows=1024, loop_block=2048),
        [
            ("looped 2048", None, 1, 16),
            ("looped 2048, evict hints", EVICT, 1, 16),
            ("looped 2048, evict hints, 8 warps", EVICT, 1, 8),
            ("looped 2048, evict hints, 2 rows", EVICT, 2, 16),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        32768,
        dict(persistent_rows=1024, loop_block=1024),
        [
            ("looped 1024", None, 1, 8),
            ("looped 1024, evict hints", EVICT, 1, 8),
            ("looped 1024, evict hints, 4 warps", EVICT, 1, 4),
            ("looped 1024, evict hints, 2 rows", EVICT, 2, 8),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        8192,
        dict(persistent_rows=1024, loop_block=2048),
        [
            ("looped 2048", None, 1, 16),
            ("looped 2048, evict hints", EVICT, 1, 16),
            ("looped 2048, evict hints, 8 warps", EVICT, 1, 8),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        8192,
        {},
        [("as written", None, 2, 32), ("as written, 1 row", None, 1, 16)],
    ),
]
TINY = [("rms_norm", torch.float32, 4, {}, [("as written", None, 1, 1)])]  # edits: GPU only (JIT text)


def helpers(source: str) -> str:
    """The module's @triton.jit helpers (_sum, _max_nan, ...) as text."""
    return "\n\n".join(re.findall(r"@triton\.jit\ndef _\w+\(.*?(?=\n\n\n|\n\n@|\n\n#)", source, flags=re.S))


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    timed = set()
    for wname, dtype, size, settings, variants in TINY if run.tiny else CASES:
        work = WORKLOADS[wname]
        sets = run.input_sets(work.make, size, dtype)
        floor = measure.floor_bytes(sets[0], measure.flat_tensors(work.fn(*sets[0])), False) / bandwidth * 1e3
        if not run.tiny and (wname, dtype, size) not in timed:  # Inductor's whole workload, same sets
            timed.add((wname, dtype, size))
            ms = run.time_ms(torch.compile(work.fn), sets)
            rows.append(
                dict(workload=wname, dtype=str(dtype), size=size, variant="inductor", ms=ms, x_floor=ms / floor)
            )
            print(rows[-1], flush=True)
        harness.fresh_cache()
        with config.override(**settings):
            compiled = minicomp.jit(work.fn).compiled(*sets[0])
            whole = minicomp.jit(work.fn)
            whole_ms = run.time_ms(whole, sets)
        rows.append(
            dict(
                workload=wname,
                dtype=str(dtype),
                size=size,
                variant=f"minicomp {settings}",
                ms=whole_ms,
                x_floor=whole_ms / floor,
            )
        )
        print(rows[-1], flush=True)
        call = compiled.kernels[0]
        launch = compiled.launch(call)
        text = getattr(launch.kernel, "src", None) or inspect.getsource(launch.kernel.fn)  # JIT or interpreter
        text = text if text.lstrip().startswith("@") else "@triton.jit\n" + text  # JITFunction.src has no decorator
        args = [compiled.bare_arguments(call, list(s)) for s in sets]
        for name, edit, xblock, warps in variants:
            kernel = launch.kernel
            if edit is not None:
                try:
                    edited = edit(text)
                except AssertionError:  # the text it edits is not written any more (see the docstring)
                    print(f"{wname}: {name}: not applicable to this kernel text", flush=True)
                    continue
                kernel = harness.kernel_from_text(edited + "\n\n\n" + helpers(compiled.source), name)  # kernel first
            grid = (launch.grid(xblock),)
            ms = run.bench(lambda *a, k=kernel: k[grid](*a, XBLOCK=xblock, num_warps=warps), args)
            rows.append(
                dict(
                    workload=wname,
                    dtype=str(dtype),
                    size=size,
                    variant=name,
                    xblock=xblock,
                    warps=warps,
                    ms=ms,
                    x_floor=ms / floor,
                )
            )
            print(rows[-1], flush=True)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
