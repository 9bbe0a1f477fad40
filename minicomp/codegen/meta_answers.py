"""One module's questions to meta kernels, each distinct one answered once (issue #42).

Codegen runs an op's meta kernel to learn what an extern call returns: whether a view is its base's
memory at the node's layout (view_layouts.py), whether torch's Python binding returns what the
overload does (aten_bindings.py). One such question costs 0.07-2.5 ms on the CPU machine (addmm's
and layer norm's meta kernels are Python), and a model's identical layers ask the same questions of
the same layouts. `Answers` keeps a module's answers by question: the op and its arguments, each
value the call reads as its layout (shape, strides, dtype: a meta kernel sees nothing else) and
every other argument with its type (`1`, `True` and `1.0` are three questions; `-0.0` and `0.0`
two). A question that cannot be written so (an argument that is not plain data) is answered anew.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from minicomp.ir import Ref, TensorMeta

T = TypeVar("T")


class Answers:
    """One module's answers, by question (see `question`)."""

    def __init__(self):
        self._known: dict[tuple, object] = {}
        self.asked = 0  # questions asked, and answered by a meta kernel (for the compile breakdown)
        self.computed = 0

    def of(self, question: tuple | None, compute: Callable[[], T]) -> T:
        """`compute()`'s answer to `question`, computed once per distinct question (every time where
        the question is None)."""
        self.asked += 1
        if question is not None and question in self._known:
            return self._known[question]
        self.computed += 1
        answer = compute()
        if question is not None:
            self._known[question] = answer
        return answer


def question(*parts, meta_of: Callable[[str], object]) -> tuple | None:
    """`parts` (an op, its arguments) as a hashable question, each Ref as its value's layout
    (`meta_of(name)`: its TensorMeta); None where a part is not plain data."""
    try:
        asked = tuple(_plain(p, meta_of) for p in parts)
        hash(asked)
    except (_NotPlain, TypeError):
        return None
    return asked


class _NotPlain(Exception):
    pass


def _plain(value, meta_of):
    if isinstance(value, Ref):
        meta = meta_of(value.name)
        if not isinstance(meta, TensorMeta):
            raise _NotPlain(value.name)
        return ("value", tuple(meta.shape), tuple(meta.stride), meta.dtype)
    if isinstance(value, torch.Tensor):  # (a tensor constant: compared by identity, not asked)
        raise _NotPlain("tensor")
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_plain(v, meta_of) for v in value))
    if isinstance(value, dict):
        return ("dict", *((k, _plain(value[k], meta_of)) for k in sorted(value)))
    if isinstance(value, float):
        return (float, value.hex())  # (-0.0 apart from 0.0; a NaN equal to itself)
    return (type(value), value)
