"""`tl.reduce` and `tl.associative_scan` with a kernel's own combine function under Triton's
interpreter: a tree, not a loop over elements.

The interpreter reduces with numpy where the combine function is one of Triton's (`tl.sum`,
`tl.max`, argmax), and otherwise calls the combine function once per element in a Python loop,
each call interpreting its ops on one-element tensors: a [8, 2048] block took seconds, and
minicomp's reductions name their own combine functions (codegen/reduction_lines.py). `enable`
makes that case a tree: the combine function is called on whole halves of the reduced axis
(element 2i with 2i+1, the odd last one carried), log2(n) calls in all. `tl.reduce` requires an
associative combine function, and a GPU combines in a tree too; the pairs keep their order
(the earlier element first), as tie-breaking combines (argmax's) need; a combine that is not
associative (a float sum's last bit, NaN through `tl.where(a > b, a, b)`) gives what a GPU's
tree would, not the loop's. A combine function that branches on its values runs the loop. A scan likewise: each
element combined with the one `offset` before it, for offsets 1, 2, 4, ... (Hillis and Steele's
inclusive scan, log2(n) calls; codegen/scan.py's scans name their combine functions too).
"""

from __future__ import annotations

import numpy as np


def enable() -> None:
    """Reduce and scan with trees under the interpreter (idempotent)."""
    from triton.runtime import interpreter

    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    if getattr(reduce_ops.generic_reduce, "_minicomp_tree", False):
        return
    reduce_loop, scan_loop = reduce_ops.generic_reduce, scan_ops.generic_scan

    def generic_reduce(self, input):
        if self.axis is None or input[0].handle.data.shape[self.axis] == 0:
            return reduce_loop(self, input)  # (the whole tensor, or nothing to reduce: the interpreter's own)
        try:
            return _tree(self, input)
        except _ValueBranch:
            return reduce_loop(self, input)

    def generic_scan(self, input):
        if self.axis is None:
            return scan_loop(self, input)
        try:
            return _scan(self, input)
        except _ValueBranch:
            return scan_loop(self, input)

    generic_reduce._minicomp_tree = True
    reduce_ops.generic_reduce = generic_reduce
    scan_ops.generic_scan = generic_scan


class _ValueBranch(Exception):
    """A combine function that branches on its values (`if a > b:`): element by element, then."""


def _combined(ops, first: list, second: list, like: list, take) -> list:
    """Where `take` (a bool array along the axis) holds: ops.combine_fn of `first` and `second`
    (arrays of the block's shape: Triton's block types must stay powers of two); elsewhere `first`.
    Raises _ValueBranch where the combine function asks a block for its truth (the interpreter
    would answer True for any block of more than one element)."""
    import triton.language as tl

    dtypes = [t for _, t in like]
    tensor = tl.core.tensor
    truth = tensor.__bool__

    def block_truth(value):
        if value.handle.data.size > 1:
            raise _ValueBranch
        return truth(value)

    tensor.__bool__ = block_truth
    try:
        with np.errstate(all="ignore"):  # (the lanes not taken may combine anything)
            combined = ops.combine_fn.fn(
                *[ops.to_tensor(a, t) for a, t in zip(first, dtypes)],
                *[ops.to_tensor(b, t) for b, t in zip(second, dtypes)],
            )
            combined = combined if isinstance(combined, tuple) else (combined,)
            return [
                np.where(
                    take, np.broadcast_to(getattr(getattr(c, "handle", None), "data", c), a.shape).astype(v.dtype), a
                )
                for c, a, (v, _) in zip(combined, first, like)
            ]
    finally:
        tensor.__bool__ = truth


def _along(axis: int, ndim: int, mask: np.ndarray) -> np.ndarray:
    """`mask` (one bool per position of the axis) shaped to broadcast along `axis`."""
    shape = [1] * ndim
    shape[axis] = mask.size
    return mask.reshape(shape)


def _scan(scan, input) -> list:
    """`scan` (an interpreter ScanOps over `axis`, inclusive) of `input` (tensors of one shape):
    element i combined with element i - offset (earlier first) for offsets 1, 2, 4, ..."""
    axis = scan.axis
    like = [(t.handle.data, t.dtype) for t in input]
    values = [v for v, _ in like]
    n, ndim, offset = values[0].shape[axis], values[0].ndim, 1
    index = np.arange(n)
    while offset < n:
        earlier = [np.roll(v, offset, axis=axis) for v in values]
        take = _along(axis, ndim, index >= offset)
        # combine(earlier, later): `_combined` keeps its first operand where not taken, so swap back
        combined = _combined(scan, earlier, values, like, take)
        values = [np.where(take, c, v) for c, v in zip(combined, values)]
        offset *= 2
    return [scan.to_tensor(v, t) for v, (_, t) in zip(values, like)]


def _tree(reduce, input) -> list:
    """`reduce` (an interpreter ReduceOps over `axis`) of `input` (tensors of one shape): element
    i combined with element i + stride (earlier first) where i is a multiple of 2 * stride, for
    strides 1, 2, 4, ...; the result is at element 0."""
    axis = reduce.axis
    like = [(t.handle.data, t.dtype) for t in input]
    values = [v for v, _ in like]
    n, ndim, stride = values[0].shape[axis], values[0].ndim, 1
    index = np.arange(n)
    while stride < n:
        later = [np.roll(v, -stride, axis=axis) for v in values]
        take = _along(axis, ndim, (index % (2 * stride) == 0) & (index + stride < n))
        values = _combined(reduce, values, later, like, take)
        stride *= 2
    results = []
    for v, (_, t) in zip(values, like):
        first = np.take(v, [0] if reduce.keep_dims else 0, axis=axis)
        results.append(reduce.to_tensor(first, t))
    return results
