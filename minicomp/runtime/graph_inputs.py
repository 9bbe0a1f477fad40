"""What a CUDA graph's replay reads (runtime/graphs.py): its inputs at their own addresses, or
copies of them in buffers the graph owns.

A static input (a parameter, a saved value, an input the code writes into) is always read in
place. A dynamic one is read in place while it stays where the warm-up call had it
(`in_place_while_it_stays`): a replay then checks its address with the static ones'
(`at_their_addresses`, one C++ call on CUDA builds) and copies nothing. Else it lives in a buffer
(`buffers_of`) that each call copies the caller's tensor into (`copy_into`) when it is not there.
"""

from __future__ import annotations

import torch

_same_ptrs = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds: one C++ call


def in_place_while_it_stays(
    inputs: list, static: list[int], dynamic: list[int], buffered: set[int], warm_ptrs: dict[int, int]
) -> tuple[list[int], set[int]]:
    """(the dynamic tensor inputs a capture reads at their own address, those left to buffers
    because they share memory). Read in place: the ones the warm-up call had at this address too
    (a caller that passes a new tensor each call is copied from the first), not in `buffered`
    already, whose memory no other input read in place shares (an output viewing it names its
    input by that memory)."""
    candidates = [
        i
        for i in dynamic
        if isinstance(inputs[i], torch.Tensor) and i not in buffered and warm_ptrs.get(i) == inputs[i].data_ptr()
    ]
    storages: dict[int, int] = {}
    for i in static + candidates:
        if inputs[i].numel():
            ptr = storage_ptr(inputs[i])
            storages[ptr] = storages.get(ptr, 0) + 1
    shared = {i for i in candidates if inputs[i].numel() and storages[storage_ptr(inputs[i])] > 1}
    return [i for i in candidates if i not in shared], shared


def at_their_addresses(args: list, ptrs: list, slots: list[int]) -> bool:
    """Whether each input at `slots` is at the address `ptrs` holds for it (a pointer per input)."""
    if _same_ptrs is not None and slots:
        return _same_ptrs(args, ptrs, slots)
    return all(args[i].data_ptr() == ptrs[i] for i in slots)


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def buffers_of(inputs: list, slots: list[int]) -> list[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """[(slot, buffer, flat memory or None)]: a buffer of the graph's own, with its value, for each
    tensor among `inputs` at `slots`."""
    buffers = []
    for i in slots:
        if isinstance(inputs[i], torch.Tensor):
            buffer, memory = _buffer_like(inputs[i])
            copy_into(buffer, memory, inputs[i])
            buffers.append((i, buffer, memory))
    return buffers


def _buffer_like(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(buffer, memory): a tensor of `t`'s shape, strides and dtype on its device, and None where it
    is contiguous, else the flat memory its elements span (an expanded input, stride 0, keeps its
    strides: the graph reads it at those; `copy_into` copies the span)."""
    if t.is_contiguous():
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device), None
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    memory = torch.empty(span, dtype=t.dtype, device=t.device)
    return memory.as_strided(t.shape, t.stride()), memory


def copy_into(buffer: torch.Tensor, memory: torch.Tensor | None, value: torch.Tensor) -> None:
    if memory is None:
        buffer.copy_(value)
    elif memory.numel():
        memory.copy_(value.as_strided((memory.numel(),), (1,)))


def copy_inputs(buffers: list, args: list) -> None:
    """Each input a record reads from its buffer copied there, unless it is that buffer."""
    targets, sources = [], []
    for i, buffer, memory in buffers:
        value = args[i]
        if value.data_ptr() != buffer.data_ptr():
            if memory is None:
                targets.append(buffer)
                sources.append(value)
            else:
                copy_into(buffer, memory, value)
    if len(targets) > 1:
        torch._foreach_copy_(targets, sources)  # one launch on a GPU
    elif targets:
        targets[0].copy_(sources[0])
