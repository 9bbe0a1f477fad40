"""Timing a matmul as planned against its padded form: does padding its sizes pay on this GPU?

cuBLAS picks its fast kernels only for operands whose leading dimensions are
multiples of 16 bytes; a vocabulary of 50257 rows puts GPT-2's projection and
both its gradients on `align1` kernels several times slower than the padded
shapes' (plan/pad_matmuls.py has the numbers). The plan asks `padding_pays`
once per class of shapes (size_classes.py); the answer is remembered in the
tuning cache, so a warm process, and a new length of the same class, measures
nothing.

    Operand = (shape, stride, copied)      copied: the padded form needs a pad kernel that
                                           no fused kernel writes for free (a graph input)
"""

from __future__ import annotations

import contextlib
import hashlib

import torch

from minicomp import config, logs
from minicomp.runtime import cache
from minicomp.runtime.size_classes import Layout, layout_class
from minicomp.runtime.tuning import median_ms

TIMED_RUNS = 10
ROUNDS = 3  # plain and padded timed in turn, up to this many times each ...
DECISIVE = 2.0  # ... or until one side is this many times faster (an align1 kernel against its padded form)
MATMULS = {"mm": torch.mm, "bmm": torch.bmm}


def padding_pays(
    op: str,
    dtype: torch.dtype,
    device: torch.device,
    plain: tuple[Layout, Layout],
    padded: tuple[Layout, Layout],
    copies: list[Layout],
) -> bool:
    """Is `op` (mm or bmm) on operands laid out as `padded`, plus a pad of each of `copies` (the
    unpadded operands that must be copied), faster than on `plain`? Measured once per shape on
    this GPU (one round where a side is DECISIVE times faster, else ROUNDS) and remembered for the
    shapes' class (size_classes.py: a new length reuses it); False when the measurement cannot run
    (out of memory)."""
    classes = [layout_class(x) for x in (*plain, *padded)], [layout_class(c) for c in copies]
    path = cache.file("tuning", f"pad_{_key(op, dtype, device, *classes)}.json")
    record = cache.read_record(path)
    if record is not None and isinstance(record.get("pays"), bool):
        return record["pays"]
    if not config.get("measure_matmuls"):
        return False
    try:
        with _real_tensors():
            plain_run = _matmul(op, dtype, device, plain)
            padded_run = _matmul(op, dtype, device, padded)
            pads = [_pad(dtype, device, c) for c in copies]
            before, after = float("inf"), float("inf")
            for _ in range(ROUNDS):  # alternated, the best of each: other work on the GPU (a forward
                # running while its backward compiles) slows one round, not one side
                before = min(before, _median_ms(plain_run))
                after = min(after, _median_ms(padded_run) + sum(_median_ms(p) for p in pads))
                if max(before, after) >= DECISIVE * min(before, after):  # (a median of 10 runs, which
                    break  # foreign work would have to slow for 5 of them to halve a side's speed)
    except torch.OutOfMemoryError:
        logs.fusion.info("padding %s %s not measured (out of memory): not padded", op, plain)
        return False
    pays = after < 0.95 * before
    logs.fusion.info(
        "%s %s -> %s: %.3f ms plain, %.3f ms padded (pads included): %s",
        op,
        [s for s, _ in plain],
        [s for s, _ in padded],
        before,
        after,
        "padded" if pays else "kept",
    )
    cache.write_record(path, {"pays": pays, "plain_ms": before, "padded_ms": after})
    return pays


@contextlib.contextmanager
def _real_tensors():
    """Real CUDA tensors and kernels, whatever traces around the compile (AOTAutograd compiles a
    forward under its fake-tensor and functionalization modes: an mm there runs nothing, and the
    events would time Python)."""
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), no_dispatch(), torch.no_grad():
        yield


def _key(*parts) -> str:
    text = "\n".join([repr(parts), torch.cuda.get_device_name(parts[2]), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _operand(layout: Layout, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    shape, stride = layout
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    return torch.randn(span, dtype=dtype, device=device).as_strided(shape, stride)


def _matmul(op: str, dtype, device, layouts: tuple[Layout, Layout]):
    a, b = (_operand(layout, dtype, device) for layout in layouts)
    return lambda: MATMULS[op](a, b)


def _pad(dtype, device, layout: Layout):
    x = _operand(layout, dtype, device)
    return lambda: torch.nn.functional.pad(x, [0, 8])


def _median_ms(run) -> float:
    run()  # cuBLAS's heuristics and workspace, outside the timed runs
    return median_ms(run, TIMED_RUNS)
