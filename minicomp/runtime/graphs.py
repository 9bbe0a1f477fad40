"""CUDA graphs: a compiled callable's launches recorded once per input signature, then replayed.

Opt-in (config "cuda_graphs"): `torch.compile(model, backend="minicomp", mode="reduce-overhead")`
or `options={"cuda_graphs": True}`, and `minicomp.jit(fn, cuda_graphs=True)`. Dispatch wraps each
compiled boxed callable (`run(args: list) -> outputs`; a Dynamo graph's forward and backward, a jit
signature) in a `Graphed`, made by one `Graphs` per model (a jit function or module, a Dynamo
graph), which holds the bound on graphs kept and hands every capture the same memory pool.

Per signature (each tensor's shape, stride and dtype and each other value, over the inputs that
are not static): the first call runs plainly on a side stream (the warm-up torch requires: Triton
compiles, launch tuning, cuBLAS workspaces), the second captures the call into a
`torch.cuda.CUDAGraph` and replays it, every later call replays it.

Inputs. *Static* inputs (parameters and buffers, which AOTAutograd or the module names; the
saved activations and parameters a backward reads; an input the compiled code writes into) are
captured at their own address and never copied: a call that passes one at another address runs
without the graph and the signature is recorded again on its next call (config
"cuda_graph_rerecords" times per callable, then the callable runs without graphs: an input it
writes into or a parameter that moves on every call). Every other tensor input is first captured
at its own address too (*in place while it stays*: a caller that passes the same tensor, or a
static buffer it refills, pays no copy), without the graph keeping it alive: a replay reads it
only when the caller's tensor is at that address. The first call that passes one at another
address runs without the graph, and from then on that input is copied into a buffer the graph
owns (outside the pool): its next call records the signature again that way. So is an input
whose memory another input captured in place shares, or that an output views in another dtype.

Outputs (graph_outputs.py). A replay writes the graph's outputs into the same memory each time; each
call hands them out uncopied, and what a caller still holds of one call's outputs when the graph is
about to write there again (its next replay, its record dropped) moves to memory of its own first:
the caller may keep outputs across calls (`out = model(x)` in a loop, .grad that autograd takes as
it is) and pays a copy only then (torch < 2.12 cannot move them: a held output is marked stale,
reading it raises, and a backward's gradients are handed out as copies). An output that is an input
(or a view of one) comes back as an alias of the caller's tensor. The exception is the saved
activations of a training forward (its outputs past the user's): the backward's graph reads them in
place, so they are handed out as they are, and a replay that would overwrite ones still referenced
(a forward called again before the previous call's backward ran: gradient accumulation over several
forwards) runs that call without the graph instead, so every backward reads its own forward's
values.

Refusals (logged on the "cudagraphs" channel; the call runs as compiled, without a graph): a CPU
tensor (or a second device) among the inputs, and a capture that fails, which is how a CPU sync
shows (`.item()`, a data-dependent shape: cudaErrorStreamCaptureUnsupported), as does a random op
drawing from a generator the graph cannot own. Both refuse the callable for good.

The device side (pool, side stream, capture, replay) is `CudaCapture` (graph_capture.py); `Graphs` takes another
(`device=`) so the logic above is tested on the CPU with a stand-in graph (tests/unit/test_graphs.py).
Replays of one model's graphs must not run concurrently on several streams (the pool's memory is
shared between them, as in Inductor's CUDA graph trees).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading

import torch

from minicomp import config, logs
from minicomp.runtime.graph_capture import CaptureRefused, CudaCapture
from minicomp.runtime.graph_inputs import (
    at_their_addresses,
    buffers_of,
    copy_inputs,
    in_place_while_it_stays,
    storage_ptr,
)
from minicomp.runtime.graph_outputs import OutputPlan, settle_held

__all__ = ["CaptureRefused", "CudaCapture", "Graphed", "Graphs"]


class Graphs:
    """The graphs of one model: at most `limit` recorded signatures over all its callables (the
    least recently replayed is dropped), all captured into one memory pool."""

    def __init__(self, limit: int | None = None, rerecords: int | None = None, device=None):
        self.limit = limit if limit is not None else config.get("cuda_graph_limit")
        self.rerecords = rerecords if rerecords is not None else config.get("cuda_graph_rerecords")
        self.device = device if device is not None else CudaCapture()
        self.kept: dict[tuple, tuple[Graphed, Record]] = {}  # (id(graphed), key) -> (its Graphed, the record)
        self.clock = itertools.count()  # a record's `used` is the clock at its last replay
        self._lock = threading.Lock()

    def wrap(self, run, name: str, static=(), saved=0, fixed=False, kept=False) -> Graphed:
        """`run` (a boxed callable) graphed. `static`: indices of the inputs captured at their own
        address (or a predicate `static(index, tensor)`, asked on the first call); `saved`: how many
        of its last outputs a backward reads (an int, or a function returning it, asked at capture);
        `fixed`: every call has one signature (a jit entry's key holds each tensor's shape, strides
        and dtype), so no key is taken per call; `kept`: callers keep its outputs across calls as a
        rule (a backward's gradients: graph_outputs.OutputPlan)."""
        return Graphed(self, run, name, static, saved, fixed, kept)

    def recorded(self) -> int:
        return len(self.kept)

    def saved_pending(self) -> bool:
        """Whether a kept record's saved values (a training forward's, for its backward) are still
        referenced: a replay of any graph of the pool may overwrite them then."""
        return any(record.saved and record.pending() for _, record in self.kept.values())

    def _keep(self, graphed: Graphed, key) -> None:
        with self._lock:
            self.kept[(id(graphed), key)] = (graphed, graphed.records[key])
            while len(self.kept) > self.limit:  # the least recently replayed goes
                oldest = min(self.kept, key=lambda k: self.kept[k][1].used)
                old, record = self.kept.pop(oldest)
                old.records.pop(oldest[1], None)
                record.release()
                logs.cudagraphs.info("%s: graph dropped (more than %d kept)", old.name, self.limit)

    def _drop(self, graphed: Graphed, key) -> None:
        with self._lock:
            self.kept.pop((id(graphed), key), None)
            record = graphed.records.pop(key, None)
            if record is not None:
                record.release()


class Record:
    """One captured signature: the graph, the buffers of the copied inputs, the addresses of the
    static ones, the outputs it writes and how each call hands them back (graph_outputs.py)."""

    __slots__ = (
        "used",
        "graph",
        "buffers",
        "static_ptrs",
        "ptrs",
        "slots",
        "outputs",
        "plan",
        "handed",
        "saved",
        "base",
        "launch",
        "__weakref__",  # (a hot path holds its record weakly: dispatch/hot_path.py)
    )

    def __init__(self, graph, buffers, static_ptrs, outputs, plan: OutputPlan):
        self.graph = graph
        self.launch = _launcher(graph)  # graph.replay
        self.buffers = buffers  # [(slot, buffer, flat memory or None)] of the copied inputs
        self.static_ptrs = static_ptrs  # [(slot, data_ptr)] of the inputs captured in place (static or not)
        self.slots = [i for i, _ in static_ptrs]  # ... as torch._C._tensors_data_ptrs_at_indices_equal takes them:
        self.ptrs = None  # a pointer per input, None where not static (set by Graphed: it knows the count)
        self.outputs = outputs  # the graph's outputs (its memory)
        self.plan = plan
        self.handed: list = []  # the storages over the pool's memory the last call handed out
        self.saved = plan.saved  # [tensor]: saved activations handed out uncopied (in the pool, or a view of a buffer)
        self.base = None  # their reference counts while only this record holds them (set by Graphed)
        self.used = 0  # Graphs.clock at its last replay

    def pending(self) -> bool:
        """Whether a saved output of the last replay is still referenced (its backward has not run):
        more references than at capture (autograd's saved variables hold its TensorImpl, a Python
        holder its object, an alias its storage). Fewer: one held at capture was transient, so the
        count is lowered."""
        now = _references(self.saved)
        if any(n > b for counts, base in zip(now, self.base) for n, b in zip(counts, base)):
            return True
        if now != self.base:
            self.base = [tuple(map(min, counts, base)) for counts, base in zip(now, self.base)]
        return False

    def replay(self, inputs: list | None) -> list:
        """Replay the graph (its inputs in place or copied already) and hand out its outputs: what a
        caller still holds of the previous call's moves out of the graph's memory first (or is
        marked stale: graph_outputs.py)."""
        plan = self.plan
        storages = self.handed = plan.ready(self.handed)
        self.launch()
        return plan.hand_out(storages, self.outputs, inputs)

    def release(self) -> None:
        """The record is dropped (its memory goes back to the pool): what callers hold of its
        outputs moves to memory of its own (or is marked stale)."""
        handed, self.handed = self.handed, []
        settle_held(handed)

    def __del__(self):
        with contextlib.suppress(Exception):  # (at interpreter exit, torch may be gone)
            self.release()


def _launcher(graph):
    """`graph.replay`; for a torch.cuda.CUDAGraph without an input liveness tracker (a debugging
    option minicomp does not ask for), its C++ method: what torch's Python method calls then."""
    if isinstance(graph, torch.cuda.CUDAGraph) and getattr(graph, "_tracker", None) is None:
        return torch._C._CUDAGraph.replay.__get__(graph)
    return graph.replay


def _references(tensors) -> list[tuple[int, int, int]]:
    """Per tensor: Python references, references to its TensorImpl (autograd's saved variables),
    references to its storage (aliases: detach, views)."""
    return [(sys.getrefcount(t), t._use_count(), _storage_uses(t)) for t in tensors]


def _storage_uses(t: torch.Tensor) -> int:
    storage = t.untyped_storage()  # (itself one reference while it lives)
    return torch._C._storage_Use_Count(storage._cdata)


class Graphed:
    """A boxed callable whose calls replay CUDA graphs (see the module docstring)."""

    def __init__(self, graphs: Graphs, run, name: str, static, saved, fixed=False, kept=False):
        self._boxed_call = True  # AOTAutograd's mark (on the instance: functools.wraps copies __dict__)
        self.graphs, self.run, self.name = graphs, run, name
        self._static_rule = None if isinstance(static, (list, tuple, set, frozenset, range)) else static
        self.static: set[int] = set() if self._static_rule is not None else set(static)
        self._saved = saved
        self.fixed = fixed  # one signature for every call (a jit entry's): no key per call
        self.kept = kept
        self.dynamic: list[int] | None = None  # decided on the first call
        self.buffered: set[int] = set()  # dynamic inputs copied into buffers (the others: in place while they stay)
        self.warm_ptrs: dict[int, int] = {}  # each dynamic tensor input's address at the last warm-up
        self.records: dict = {}
        self.warmed: set = set()
        self.refused: str | None = None
        self.rerecorded = 0
        self._device = None
        self._pending_said = False
        self.misses = 0  # calls in a row whose static inputs were not where the graph reads them

    def __call__(self, args: list):
        if self.refused is not None:
            return self.run(args)
        if self.dynamic is None:
            return self._first(args)
        key = () if self.fixed else self._key(args)
        record = self.records.get(key)
        if record is None:
            if key in self.warmed:
                return self._capture(args, key)
            return self._warmup(args, key)
        return self._replay(record, args, key)

    def _key(self, args) -> tuple:
        return tuple(
            (a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
            for a in map(args.__getitem__, self.dynamic)
        )

    def refuse(self, why: str) -> None:
        """No graphs for this callable from now on."""
        self.refused = why
        for key in list(self.records):
            self.graphs._drop(self, key)
        logs.cudagraphs.info("%s runs without CUDA graphs: %s", self.name, why)

    # -- the first call of the callable, and of each signature --------------------------------
    def _first(self, args: list):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        try:
            self._device = self.graphs.device.device_of(tensors)
        except CaptureRefused as why:
            self.refuse(str(why))
            return self.run(args)
        if self._static_rule is not None:
            self.static = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and self._static_rule(i, a)}
        self.dynamic = [i for i in range(len(args)) if i not in self.static]
        return self._warmup(args, () if self.fixed else self._key(args))

    def _warmup(self, args: list, key):
        dynamic = self.dynamic
        watched = [(i, args[i], args[i]._version) for i in dynamic if isinstance(args[i], torch.Tensor)]
        outputs = self.graphs.device.warmup(self.run, args, self._device)
        written = {i for i, t, version in watched if t._version != version}
        if written:  # an input it writes into: captured in place, so that the writes reach the caller's tensor
            self.static |= written
            self.dynamic = [i for i in dynamic if i not in written]
            self.warmed.clear()  # the keys of the signatures warmed up so far had those inputs
            key = tuple(k for i, k in zip(dynamic, key) if i not in written)
        self.warmed.add(key)
        self.warm_ptrs = {i: t.data_ptr() for i, t, _ in watched}
        return outputs

    def _capture(self, args: list, key):
        inputs, count = list(args), len(args)
        args.clear()
        static = [i for i in sorted(self.static) if isinstance(inputs[i], torch.Tensor)]
        adopted, shared = in_place_while_it_stays(inputs, static, self.dynamic, self.buffered, self.warm_ptrs)
        self.buffered |= shared
        static_ptrs = [(i, inputs[i].data_ptr()) for i in sorted(static + adopted)]
        buffers = buffers_of(inputs, [i for i in self.dynamic if i not in adopted])
        # (no local names a buffer or an output: a capture's reference counts are `Record.pending`'s base)
        captured = [next((b for j, b, _ in buffers if j == i), value) for i, value in enumerate(inputs)]
        saved = self._saved() if callable(self._saved) else self._saved
        try:
            graph, outputs = self.graphs.device.capture(self.run, list(captured), self._device)
        except Exception as err:  # noqa: BLE001 - a CPU sync, a generator the graph cannot own: no graph
            self.graphs.device.failed(self._device)
            self.refuse(f"capturing it failed ({_first_line(err)})")
            return self.run(inputs)
        outputs = tuple(outputs)
        in_place = {storage_ptr(inputs[i]) for i in static if inputs[i].numel()}
        # an input read from a buffer or in place while it stays: storage address -> (slot, the
        # storage offset of the caller's first element, dtype); an output viewing it is rebuilt on
        # the caller's tensor
        viewed = {storage_ptr(b): (i, 0, b.dtype, False) for i, b, _ in buffers if b.numel()}
        viewed |= {
            storage_ptr(inputs[i]): (i, inputs[i].storage_offset(), inputs[i].dtype, True)
            for i in adopted
            if inputs[i].numel()
        }
        del captured
        first_saved = len(outputs) - saved if 0 < saved <= len(outputs) else len(outputs)
        plan = OutputPlan(outputs, in_place, viewed, first_saved, self.kept)
        unviewable = {i for i in adopted if i in plan.unviewable}
        if unviewable:  # (nothing ran: a capture only records) copied from now on, recorded that way
            self.buffered |= unviewable
            del graph, outputs, plan
            return self._capture(inputs, key)
        record = Record(graph, buffers, static_ptrs, outputs, plan)
        record.ptrs = [dict(static_ptrs).get(i) for i in range(count)]
        record.base = _references(record.saved)
        record.used = next(self.graphs.clock)
        self.records[key] = record
        self.graphs._keep(self, key)
        logs.cudagraphs.info("%s: graph recorded (%d kept)", self.name, self.graphs.recorded())
        return record.replay(inputs)

    # -- a replay ---------------------------------------------------------------------------------
    def _replay(self, record: Record, args: list, key):
        if not at_their_addresses(args, record.ptrs, record.slots):
            return self._moved(args, key, record)
        if record.saved and self.graphs.saved_pending():
            # this record's saved values, or another signature's (one pool: a graph recorded after
            # that one's backward ran may use its memory as scratch), are still to be read
            if not self._pending_said:
                self._pending_said = True
                logs.cudagraphs.info(
                    "%s: the saved values of its last replay are still in use (its backward has not run): "
                    "this call runs without the graph",
                    self.name,
                )
            return self.run(args)
        return self.replay_recorded(record, args)

    def replay_recorded(self, record: Record, args: list):
        """Replay `record`, its inputs at the addresses it reads in place (checked by the caller):
        the others copied into its buffers, its outputs handed out. `args` is consumed (cleared),
        as a boxed call's are."""
        if record.buffers:
            copy_inputs(record.buffers, args)
        inputs = list(args) if record.plan.of_inputs else None  # (outputs that view an input's buffer)
        args.clear()
        self.misses = 0
        record.used = next(self.graphs.clock)
        return record.replay(inputs)

    def _moved(self, args: list, key, record: Record):
        """An input captured in place at another address than captured: this call runs without the
        graph. A dynamic one is copied into a buffer from then on, and the signature recorded that
        way on its next call. A static one: a second such call in a row records the signature again
        (a bounded number of times): a parameter replaced, not a forward run once without its graph
        (`Record.pending`)."""
        moved = {i for i, ptr in record.static_ptrs if args[i].data_ptr() != ptr}
        if moved and not moved & self.static:
            self.buffered |= moved
            self.graphs._drop(self, key)
            self.warmed.add(key)  # warmed up already: the next call captures
            logs.cudagraphs.info("%s: an input came at another address: copied into a buffer from now on", self.name)
            return self.run(args)
        self.misses += 1
        if self.misses >= 2:
            self.misses = 0
            self.graphs._drop(self, key)
            self.rerecorded += 1
            if self.rerecorded > self.graphs.rerecords:
                self.refuse(
                    f"a static input (a parameter, a saved value, an input it writes into) moved "
                    f"{self.rerecorded} times"
                )
            else:
                logs.cudagraphs.info("%s: a static input moved: recording its graph again", self.name)
                self.warmed.add(key)  # warmed up already: the next call captures
        return self.run(args)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
