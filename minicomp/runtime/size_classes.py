"""The size classes a measurement is shared by: a new batch size or sequence length reuses what a
size of its class measured, instead of timing again (issue #42).

    bucket(4088) == bucket(4096) == 4096        bucket(4097) == 8192
    layout_class(((4088, 1024), (1024, 1))) == ((4096, 1024), (1, 0), (16, 1))

A size's class is its next power of two. A layout's class is its sizes' classes, the order of its
strides (which dimension is contiguous) and each stride's alignment (its gcd with 16 elements):
what cuBLAS's kernel choice and a launch configuration's speed depend on, without the exact
length. Three measurements are keyed by class (each remembered in the tuning cache):
- a kernel's launch configuration (records.py `tuning_path`, by its size's bucket); the
  remembered choice is taken only where it is one of this size's candidates (tuning.py);
- whether padding a matmul pays (matmul_timing.py);
- whether a matmul template beats cuBLAS (matmul_choice.py).
The first size of a class measures; the others of its class take its answer.
"""

from __future__ import annotations

import math

Layout = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, stride)


def bucket(n: int) -> int:
    """`n`'s size class: its next power of two (0 and 1 themselves)."""
    return n if n <= 1 else 1 << (n - 1).bit_length()


def layout_class(layout: Layout) -> tuple:
    """(each size's bucket, the dimensions from the smallest stride up, each stride's gcd with 16)."""
    shape, stride = layout
    order = tuple(sorted(range(len(stride)), key=lambda d: (stride[d], -d)))
    return tuple(bucket(n) for n in shape), order, tuple(math.gcd(s, 16) for s in stride)
