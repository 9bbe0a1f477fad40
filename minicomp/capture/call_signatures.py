"""How a dynamic graph's call finds the static graph compiled for its sizes (capture/specialize.py).

`signature(value)`: what a call's key holds of each argument (a tensor's shape, strides, storage
offset, dtype and device; another value's type and value). `LastCall`: the last call's signature,
checked without building the key.
"""

from __future__ import annotations

import torch

try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # (a torch without Dynamo's C++ guards: every call is keyed)
    TensorGuards = None


def signature(value) -> tuple:
    """What a call's key holds of one argument."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
    return (type(value), value)


class LastCall:
    """A call's signature checked without building its key (building it took 0.1 ms a call under
    cProfile for GPT-2's 30 inputs on an H200, before the first kernel's launch): its tensors'
    dtype, device, sizes and strides by torch's `TensorGuards` (what Dynamo's tensor guards are
    built on) in one C++ call, their storage offsets and the other values as the key compares them.
    Stricter than the key (it also compares requires_grad and dispatch keys): a miss takes the
    keyed way."""

    __slots__ = ("entry", "guards", "count", "tensors", "offsets", "others")

    def __init__(self, entry, guards, count: int, tensors: list[int], offsets: list[int], others: list[tuple]):
        self.entry, self.guards, self.count = entry, guards, count  # (count: the call's arguments)
        self.tensors, self.offsets, self.others = tensors, offsets, others  # (positions, offsets, keys)

    @staticmethod
    def of(values: list, entry) -> LastCall | None:
        if TensorGuards is None:
            return None
        tensors = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        chosen = [values[i] for i in tensors]
        try:
            guards = TensorGuards(
                *chosen,
                dynamic_dims_sizes=[list(t.shape) for t in chosen],
                dynamic_dims_strides=[list(t.stride()) for t in chosen],
            )
        except Exception:  # noqa: BLE001 - (a tensor type the guards do not take): every call is keyed
            return None
        offsets = [t.storage_offset() for t in chosen]
        others = [(i, signature(v)) for i, v in enumerate(values) if not isinstance(v, torch.Tensor)]
        return LastCall(entry, guards, len(values), tensors, offsets, others)

    def matches(self, values: list) -> bool:
        if len(values) != self.count:
            return False
        try:
            chosen = [values[i] for i in self.tensors]
            if not self.guards.check(*chosen):
                return False
        except TypeError:  # (another type where a tensor was)
            return False
        return all(t.storage_offset() == o for t, o in zip(chosen, self.offsets)) and all(
            signature(values[i]) == key for i, key in self.others
        )
