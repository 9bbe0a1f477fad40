"""`JitFunction`: one compiled module per input signature, looked up on every call.

A call flattens its arguments, builds the signature key (each tensor's shape,
stride, dtype, device, requires_grad; each Python scalar's type and value),
and finds the compiled entry for it; the first call with a new key traces and
compiles. A hit does nothing else: the generated `call` launches the kernels.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from typing import TYPE_CHECKING

import torch
import torch.autograd.profiler as _profiler

from minicomp import capture, config, gc_pause, guards, logs
from minicomp.dispatch import fallback, persist
from minicomp.dispatch.arguments import Arguments
from minicomp.dispatch.autograd import TrainingEntry
from minicomp.dispatch.entries import EagerEntry, Entry
from minicomp.dispatch.hot_path import MISS, HotPath, hot_path
from minicomp.guards import fingerprint
from minicomp.guards.context import FunctionContext, watch
from minicomp.runtime import compile_pool, launch

if TYPE_CHECKING:
    from minicomp.codegen.families import Families
    from minicomp.pipeline import Compiled


def _needs_grad(leaves) -> bool:
    """Grad mode is on and some tensor argument requires grad."""
    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves)


def _name_of(fn) -> str:
    name = getattr(fn, "__name__", None)
    if isinstance(name, str):
        return name
    inner = getattr(fn, "func", None)  # functools.partial
    return f"partial_{_name_of(inner)}" if inner is not None else type(fn).__name__


def _copy(value):
    """A copy of a tensor argument with the same strides and requires_grad (for looking inside):
    the memory its elements span, copied whole, so an expanded or overlapping argument (`b.expand(
    64, n)`, stride 0) keeps its strides, which `copy_` into such a layout refuses."""
    if not isinstance(value, torch.Tensor):
        return value
    span = 1 + sum((n - 1) * st for n, st in zip(value.shape, value.stride())) if value.numel() else 0  # layout.extent
    with torch.no_grad():
        memory = value.as_strided((span,), (1,)).clone()
    return memory.as_strided(value.shape, value.stride()).requires_grad_(value.requires_grad)


class JitFunction:
    """A function compiled by minicomp; call it like the original."""

    def __init__(
        self,
        fn,
        fallback: str | None = None,
        name: str | None = None,
        context=None,
        cuda_graphs=None,
        state_first: bool = False,
    ):
        """`state_first`: `fn` is a module's `(state, *args, **kwargs)`, its first argument the
        parameters and buffers by name (modules.py), flattened without pytree where it can be."""
        if not callable(fn):
            raise TypeError(f"minicomp.jit needs a function or module, not {type(fn).__name__}")
        self.fn = fn
        self.fallback = config.fallback(fallback)
        self.cache_limit = config.cache_limit()  # signatures kept per function
        self.recompile_warning = config.recompile_warning()
        config.compile_threads()  # checked now; read when a GPU compile first needs its threads
        try:
            functools.update_wrapper(self, fn)
        except (AttributeError, TypeError):
            pass
        self.__name__ = name or _name_of(fn)
        self.arguments = Arguments(fn, state_first, self.cache_limit)  # arguments.py: leaves and a spec
        self._flatten = self.arguments.flatten
        self.context = context or FunctionContext(fn)
        # a plain function that reads no Python state (globals, cells) keys its calls by the arguments alone
        reads = self.context.reads
        empty = isinstance(self.context, FunctionContext) and not len(reads)
        self._context_state = None if empty else self.context.state
        self.cache: dict[guards.SignatureKey, Entry | EagerEntry | TrainingEntry] = {}
        self.compiles = 0  # how many signatures were compiled (tests and `recompiles` logs read it)
        self._fingerprint: str | None | bool = False  # computed on the first compile; None: not persistable
        # traces that changed Python state (context.py `watch`): once may be a lazy initialization (a
        # cache made on the first call); twice, and every later call runs eagerly without tracing
        self._side_effects = 0
        self._fingerprinted_state = None  # the values read that the fingerprint was taken under
        self._families: Families | None = None  # made on the first compile (codegen/families.py)
        self._lock = threading.RLock()
        self._hot: HotPath | None = None  # the signature that last ran, checked before the key (hot_path.py)
        self.graphs = None  # runtime/graphs.py: CUDA graphs of its signatures, when asked for
        if cuda_graphs or (cuda_graphs is None and config.get("cuda_graphs")):
            from minicomp.runtime.graphs import Graphs

            self.graphs = Graphs()

    # -- the call path --------------------------------------------------------

    @property
    def families(self) -> Families:
        """This function's kernel families; code generation loads on the first compile, so a
        process served from the persistent cache never imports it."""
        if self._families is None:
            from minicomp.codegen.families import Families

            self._families = Families()
        return self._families

    def _key(self, leaves, in_spec) -> tuple:
        """The call's signature key as a plain tuple of guards.SignatureKey's fields (structure,
        leaves, modes, context): it finds the SignatureKey the cache holds (equal, same hash)."""
        state = self._context_state
        return (in_spec, tuple(map(guards.leaf_key, leaves)), guards.global_state(), None if state is None else state())

    def __call__(self, *args, **kwargs):
        hot = self._hot
        if hot is not None and not kwargs and not _profiler._is_profiler_enabled:
            result = hot.call(args, self._context_state)
            if result is not MISS:
                return result
        leaves, in_spec = self._flatten(args, kwargs)
        key = self._key(leaves, in_spec)
        entry = self.cache.get(key)
        if entry is None:
            return self._first_call(key, leaves, in_spec)
        if _profiler._is_profiler_enabled:  # a named range in torch.profiler traces; free otherwise
            with torch.profiler.record_function(f"minicomp: {self.__name__}"):
                return entry(self.fn, leaves, in_spec)
        result = entry(self.fn, leaves, in_spec)
        self._heat(key, leaves, entry)
        return result

    def _heat(self, key: tuple, leaves, entry) -> None:
        """`entry`'s signature checked first on the next call (hot_path.py), where it can be."""
        if type(entry) is not Entry:  # (eager, or a training signature: keyed every call)
            self._hot = None
            return
        hot = entry.hot
        # made again where it served no call that went to its entry (made from a Parameter, a
        # call now passes a tensor; a graphed input moved) or its record changed
        if hot is None or hot is self._hot or hot.stale():
            hot = entry.hot = hot_path(self.fn, key, leaves, entry)
        self._hot = hot

    # -- a new signature -------------------------------------------------------
    def _first_call(self, key, leaves, in_spec):
        """Compile the signature and run it once, under the lock. Whatever fails before the
        compiled code has returned (tracing, compiling, or its first run) falls back by policy:
        nothing of the user's has changed by then (mutations are written back last)."""
        if self._side_effects > 1:  # its Python state changes on every call: each new key would trace in vain
            return capture.call_eagerly(self.fn, leaves, in_spec)
        key = guards.SignatureKey(*key)
        if guards.INSIDE_A_TRACE in key.leaves:  # a jitted function calling this one is being traced: be its code
            return capture.call_eagerly(self.fn, leaves, in_spec)
        if launch.interpreting():  # called from a signal handler or __del__ while a kernel runs: compile later
            return capture.call_eagerly(self.fn, leaves, in_spec)
        failure = None
        with self._lock:
            entry = self.cache.get(key)
            if entry is None:
                self._note_recompile(key)
                try:
                    with gc_pause.paused(config.get("pause_gc")):  # (tracing and compiling: short-lived objects)
                        entry = self._build(key, leaves, in_spec)
                    if self.graphs is not None:
                        self._graphed(entry)
                    result = entry(self.fn, leaves, in_spec)
                    entry.ran = True
                except Exception as err:  # noqa: BLE001 - any failure falls back to eager, by policy
                    failure, entry = err, EagerEntry()
                    self._side_effects += isinstance(err, guards.SideEffect)
                if failure is not None and self.fallback == "raise":  # raises: nothing is remembered
                    fallback.handle(self.__name__, failure, self.fallback, stacklevel=3)
                self._remember(key, entry)
                if failure is None:
                    return result
        if failure is None:
            return entry(self.fn, leaves, in_spec)
        try:
            result = entry(self.fn, leaves, in_spec)
        except Exception:  # the function fails as written (bool - bool): eager's error alone, no warning
            with self._lock:
                if self.cache.get(key) is entry:  # a later call tries again (and says why it runs eagerly)
                    del self.cache[key]
                    self._hot = None
            raise
        fallback.handle(self.__name__, failure, self.fallback, stacklevel=3)
        return result

    def _remember(self, key: guards.SignatureKey, entry) -> None:
        if len(self.cache) >= self.cache_limit:  # bounded: forget the oldest signature
            self.cache.pop(next(iter(self.cache)))
            self._hot = None
        self.cache[key] = entry
        self.compiles += 1

    def _build(self, key: guards.SignatureKey, leaves, in_spec):
        unusual = guards.unusual(key.leaves)
        if unusual is not None:
            raise guards.Unguarded(unusual.why)
        if guards.in_functorch_transform(key.modes):
            raise guards.Unguarded(
                "it is called inside a functorch transform (vmap, grad, jacrev), whose wrapped tensors "
                "compiled kernels cannot read"
            )
        bad = guards.unguardable(key.leaves)
        if bad is not None:
            raise guards.Unguarded(
                f"an argument is a {type(bad.obj).__name__} object, and minicomp cannot tell "
                "when an object changes. Pass the values it holds (tensors, numbers, strings) "
                "instead"
            )
        leaves, in_spec = list(leaves), Arguments.spec(in_spec)
        names = capture.leaf_names(in_spec, self.arguments.params)
        fn = watch(self.fn, self.context)
        if _needs_grad(leaves):
            compile_pool.start_triton(leaves)  # a miss: Triton's one-time costs run while it traces
            return TrainingEntry(
                fn,
                leaves,
                in_spec,
                self.__name__,
                [n for n, v in zip(names, leaves) if isinstance(v, torch.Tensor)],
                self.families,
                self.fallback,
            )
        stored_key = self._persistent_key(key)
        if stored_key is not None:
            stored = persist.load(stored_key)
            if stored is not None:
                module, slots, mutated, outputs = stored
                return Entry(module.call, slots, len(leaves), outputs, mutated)
        compile_pool.start_triton(leaves)  # a miss: Triton's one-time costs run while it traces
        traced, compiled = _trace_and_compile(fn, leaves, in_spec, names, self.__name__, self.families)
        guards.refuse_grad_constants(traced.closed_over, torch.is_grad_enabled())
        mutated = _mutated_slots(traced, compiled)
        if stored_key is not None and not compiled.graph.constants:
            persist.store(
                stored_key,
                compiled.source,
                self.__name__,
                compiled.interpret,
                traced.tensor_slots,
                mutated,
                traced.outputs,
            )
        watched = guards.grad_watched(traced.closed_over)
        constants = traced.closed_over if mutated else []
        return Entry(
            compiled.call, traced.tensor_slots, len(leaves), traced.outputs, mutated, compiled, watched, constants
        )

    def _graphed(self, entry) -> None:
        """`entry`'s calls replaying CUDA graphs (runtime/graphs.py): the inputs it writes into
        and the module's parameters and buffers are read in place, other tensors copied in. A
        training signature runs without graphs (torch.compile's are graphed: dispatch/dynamo.py)."""
        if isinstance(entry, TrainingEntry):
            logs.cudagraphs.info("%s: a training signature of minicomp.jit runs without CUDA graphs", self.__name__)
        if not isinstance(entry, Entry):  # (a CPU signature's graphs refuse on its first call)
            return
        positions = entry.slots or entry.tensor_slots
        written = {p for p, slot in enumerate(positions) if slot in entry.mutated}
        module = getattr(self.context, "module", None)
        state = set() if module is None else {t.data_ptr() for t in [*module.parameters(), *module.buffers()]}

        def static(i: int, t: torch.Tensor) -> bool:
            return i in written or isinstance(t, torch.nn.Parameter) or t.data_ptr() in state

        call = entry.call
        graphed = self.graphs.wrap(lambda args: call(*args), self.__name__, static=static, fixed=True)
        entry.call = lambda *args: graphed(list(args))
        entry.graphed = graphed

    def _persistent_key(self, key: guards.SignatureKey) -> str | None:
        """The key of this signature on disk: the fingerprint of the function and what it reads,
        with the arguments' key. The values the code reads (globals, cells: `split` by the
        context) are in the fingerprint, which is taken again when they changed; a module's
        attributes and flags stay in the key."""
        in_key, read = (None, None) if key.context is None else self.context.split(key.context)
        key = (key.structure, key.leaves, key.modes, in_key)  # a plain tuple: its repr is the key on disk
        if guards.contains(key, guards.ByIdentity):
            logs.cache.info(
                "%s: a signature keyed by an object's identity is not cached across processes", self.__name__
            )
            return None
        if self._fingerprint is False or read != self._fingerprinted_state:
            self._fingerprinted_state = read
            of = getattr(self.context, "fingerprint", None)
            self._fingerprint = of() if of is not None else fingerprint.of(self.fn)
            if self._fingerprint is None:
                logs.cache.info(
                    "%s reads state minicomp cannot fingerprint: not cached across processes", self.__name__
                )
        return None if self._fingerprint is None else persist.key(self._fingerprint, key)

    def _note_recompile(self, key: guards.SignatureKey) -> None:
        if not self.cache:
            return
        change = guards.describe_change(next(reversed(self.cache)), key, self.context)
        logs.recompiles.info("%s: new signature (%s); %d compiled so far", self.__name__, change, self.compiles)
        if self.compiles + 1 == self.recompile_warning:
            warnings.warn(
                f"minicomp has compiled {self.__name__} for {self.recompile_warning} signatures "
                f"(last change: {change}). Each new shape, "
                "dtype, stride or scalar value traces and compiles again; MINICOMP_LOGS=recompiles "
                "shows each one.",
                stacklevel=5,
            )

    # -- looking inside -------------------------------------------------------
    def entry(self, *args, **kwargs):
        """What these arguments compile to (compiling it, on copies of the tensors, if needed)."""
        leaves, in_spec = self._flatten(args, kwargs)
        key = self._key(leaves, in_spec)
        if key not in self.cache:
            self._first_call(key, [_copy(v) for v in leaves], in_spec)
        entry = self.cache[key]
        if isinstance(entry, Entry) and entry.compiled is None:  # loaded from disk: trace to see inside
            leaves, in_spec = [_copy(v) for v in leaves], Arguments.spec(in_spec)
            names = capture.leaf_names(in_spec, self.arguments.params)
            _, entry.compiled = _trace_and_compile(
                watch(self.fn, self.context), leaves, in_spec, names, self.__name__, self.families
            )
        return entry

    def compiled(self, *args, **kwargs) -> Compiled:
        """The compiled graph for these arguments (the forward graph when training)."""
        entry = self.entry(*args, **kwargs)
        compiled = entry.forward if isinstance(entry, TrainingEntry) else entry.compiled
        if compiled is None:
            raise fallback.CompileError(f"{self.__name__} runs eagerly for these arguments: nothing was compiled")
        return compiled

    def source(self, *args, **kwargs) -> str:
        """The generated module(s) for these arguments: Triton kernels + Python wrapper
        (forward, then backward, when an input requires grad)."""
        entry = self.entry(*args, **kwargs)
        return entry.source if isinstance(entry, TrainingEntry) else self.compiled(*args, **kwargs).source


def _trace_and_compile(fn, leaves, in_spec, names, name, families) -> tuple[capture.Traced, Compiled]:
    from minicomp.pipeline import compile_graph  # fusion and codegen load on the first miss

    start = time.perf_counter()
    traced = capture.trace(fn, leaves, in_spec, names)
    traced_s = time.perf_counter() - start
    compiled = compile_graph(traced.gm, name, traced.input_names, families, inference=True)  # no input needs grad
    compiled.times = {"capture": traced_s} | compiled.times
    return traced, compiled


def _mutated_slots(traced: capture.Traced, compiled: Compiled) -> list[int]:
    """Argument slots of the inputs the compiled module writes into (graph.mutations)."""
    inputs = compiled.graph.inputs
    written = {dst for dst, _ in compiled.graph.mutations}
    return [slot for slot, name in zip(traced.tensor_slots, inputs) if name in written]
