"""What a CUDA graph's replay hands back (runtime/graphs.py): its outputs uncopied.

A replay writes its outputs into the same memory of the pool every time. Each call hands out new
tensors over that memory (one storage per memory: outputs that view one memory stay views of one
another; the last call's storage again where the caller holds nothing of it), without a copy.
Just before the graph writes there again (its next replay, or its record dropped and the memory
given back to the pool), each storage a caller still holds is copied out to memory of its own,
and the caller's tensors (views included) move with it (`UntypedStorage._swap_data_ptr_`, as
torch's CUDA graph trees move storages). So every output stays valid for as long as the caller
keeps it, and a call whose caller has dropped the previous outputs (`out = f(x); use(out); del
out`, a training step's gradients reset to None) copies nothing: no clone per call, where the
plain copy costs a launch. (A caller that keeps only an output's storage object, `out.
untyped_storage()`, holds the same Python object this module does, which is not seen as held.)

Where storages cannot move (torch < 2.12), a held output is marked instead: reading it raises
STALE, as Inductor's CUDA graphs do, except outputs callers keep as a rule (a backward's gradients,
which autograd accumulates into), which are handed out as copies then.

The other outputs: one that is an input captured in place (or a view of one) comes back as a new
alias of it; one that views an input the graph reads from its buffer comes back as the same view
of the caller's tensor, as eager returns it; a training forward's saved values go to the backward
as they are (graphs.py `Record.pending`).
"""

from __future__ import annotations

import functools

import torch

_cuda_tensor_at = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)  # one C++ call


class View:
    """One output as a view of a handed memory: its index among the outputs and its metadata."""

    __slots__ = ("index", "dtype", "shape", "stride", "offset", "meta", "on")

    def __init__(self, index: int, t: torch.Tensor, base: int = 0):
        """`base`: an offset `offset` is taken from (an input's first element, for its views)."""
        self.index, self.dtype, self.shape, self.stride, self.offset = (
            index,
            t.dtype,
            t.shape,
            t.stride(),
            t.storage_offset() - base,
        )
        self.meta = {"size": t.shape, "stride": t.stride(), "dtype": t.dtype, "storage_offset": self.offset}
        # on(storage) -> the view: one C++ call on a GPU
        self.on = (
            functools.partial(_cuda_tensor_at, self.meta) if _cuda_tensor_at is not None and t.is_cuda else self._on_any
        )

    def _on_any(self, storage: torch.UntypedStorage) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=storage.device).set_(
            storage, self.offset, self.shape, self.stride
        )


class Memory:
    """A memory of the pool that outputs view: its address, size and device, and those views."""

    __slots__ = ("ptr", "nbytes", "device", "views")

    def __init__(self, storage: torch.UntypedStorage):
        self.ptr, self.nbytes, self.device = storage.data_ptr(), storage.nbytes(), storage.device
        self.views: list[View] = []


class OutputPlan:
    """How a record's outputs come back on each call, sorted once at capture."""

    __slots__ = ("memories", "aliased", "of_inputs", "empty", "saved", "copied", "unviewable")

    def __init__(
        self,
        outputs: tuple,
        in_place: set[int],
        viewed: dict[int, tuple[int, int, torch.dtype, bool]],
        first_saved: int,
        kept: bool = False,
    ):
        """`in_place`: storage addresses of the static inputs (captured in place); `viewed`: storage
        address of an input the graph reads from a buffer or in place while it stays -> (its slot,
        the storage offset there of the caller's tensor's first element, its dtype, whether the
        memory is the caller's: in place); `first_saved`: index of
        the first saved value (a training forward's outputs past the user's); `kept`: outputs
        callers keep across calls as a rule (a backward's gradients, which autograd accumulates
        into): where a held output cannot move, they are handed out as copies."""
        # without moves, a held output is marked stale; a kept one, or one where nothing can mark it, is copied
        self.copied = not _moves and (kept or _poison is None)
        memories: dict[int, Memory] = {}
        self.aliased: list[int] = []  # outputs in an input's own memory: a new alias each call
        self.of_inputs: list[tuple[int, View]] = []  # (slot, view at an offset from the caller's first element)
        self.unviewable: set[int] = set()  # slots of `viewed` an output views in another dtype or before its start
        self.empty: list[int] = []  # outputs with no elements
        self.saved: list[torch.Tensor] = []
        for i, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                continue
            ptr = o.untyped_storage().data_ptr() if o.numel() else None
            slot, base, dtype, caller_memory = viewed.get(ptr, (None, 0, None, False))
            if ptr is not None and ptr in in_place:
                self.aliased.append(i)
            elif i >= first_saved and not caller_memory:  # (a replay overwrites no caller's memory)
                self.saved.append(o)
            elif slot is not None and o.dtype == dtype and o.storage_offset() >= base:
                self.of_inputs.append((slot, View(i, o, base)))
            elif slot is not None:  # (as_strided on the caller's tensor would keep its dtype)
                self.unviewable.add(slot)
                memories.setdefault(ptr, Memory(o.untyped_storage())).views.append(View(i, o))
            elif ptr is None:
                self.empty.append(i)
            else:
                memory = memories.get(ptr)
                if memory is None:
                    memory = memories[ptr] = Memory(o.untyped_storage())
                memory.views.append(View(i, o))
        self.memories = list(memories.values())

    def ready(self, before: list) -> list:
        """Before a replay writes the pool's memory: the storage each memory's outputs are handed
        out on (one per memory), given `before`, those the last call handed out. One no caller
        holds any more is still over its memory and is handed out again (a storage fewer to make);
        one a caller holds is settled first (moved out or marked: `settle`) and a new one made.
        Copied plans hand out clones made after the replay: nothing here."""
        if self.copied:
            return []
        storages = []
        for m, memory in enumerate(self.memories):
            storage = before[m] if m < len(before) else None  # (None: settled already)
            if storage is not None and _use_count(storage._cdata) > 1:
                settle(storage)
                storage = None
            if storage is None or storage.data_ptr() != memory.ptr:  # (a caller may resize a storage it dropped)
                storage = torch._C._construct_storage_from_data_pointer(memory.ptr, memory.device, memory.nbytes)
            storages.append(storage)
        return storages

    def hand_out(self, storages: list, outputs: tuple, inputs: list) -> list:
        """What the caller gets after the replay: the outputs as views of `storages` (`ready`'s),
        new aliases of the inputs captured in place, views of the caller's inputs, empty tensors."""
        results = list(outputs)
        if self.copied:  # one copy a memory: outputs that view it stay views of one another
            storages = [outputs[memory.views[0].index].untyped_storage().clone() for memory in self.memories]
        for storage, memory in zip(storages, self.memories):
            for view in memory.views:
                results[view.index] = view.on(storage)
        for i in self.aliased:
            results[i] = outputs[i].detach()
        for slot, view in self.of_inputs:  # (offsets from the caller's first element)
            value = inputs[slot]
            results[view.index] = value.as_strided(view.shape, view.stride, value.storage_offset() + view.offset)
        for i in self.empty:
            o = outputs[i]
            results[i] = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
        return results


_moves = hasattr(torch.UntypedStorage, "_swap_data_ptr_")  # torch >= 2.12
_poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)  # CUDA builds

STALE = (
    "minicomp: this tensor is an output of a CUDA graph's earlier call, and a later call of the graph "
    "wrote over its memory. Clone it to keep it across calls (torch >= 2.12 keeps it for you)."
)


_use_count = torch._C._storage_Use_Count


def settle_held(storages: list) -> None:
    """Each storage of `storages` a caller still holds (more references than this list's own),
    before the graph's memory is written again (its record dropped): settled (`settle`), its place
    in the list None (never handed out again: one marked stays marked after its holder drops it,
    even while the graph replays)."""
    for k, storage in enumerate(storages):
        if storage is not None and _use_count(storage._cdata) > 1:
            storages[k] = None
            settle(storage)


def settle(storage: torch.UntypedStorage) -> None:
    """A storage a caller holds over the pool's memory: moved to memory of its own with its values
    (the caller's tensors move with it), or, where storages cannot move, marked so that reading it
    raises STALE."""
    if _moves and not _capturing():  # (a record collected while another graph captures: no copy then)
        own = torch.empty(storage.nbytes(), dtype=torch.uint8, device=storage.device).untyped_storage()
        own.copy_(storage)
        storage._swap_data_ptr_(own)  # the caller's tensors now read `own`'s memory; `own` the pool's
    elif _poison is not None:
        _poison(storage._cdata, STALE)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
