"""Launching one generated kernel: pick its configuration once, then launch with nothing in between.

A generated module makes one `Launch` per kernel when it is imported, with the
spec of the kernel's kind (launch_spec.py),

    launch_0 = Launch(mc_fused_add_relu_0, PointwiseLaunch(numel=4096), device="cuda:0")

and its `call()` runs `launch_0(x, b, relu, 4096)`. The first call on a GPU
chooses (block, num_warps) (tuning.py) and gets the compiled kernel: compiled
ahead (ahead.py), from a record an earlier process left (records.py), else
through Triton's JIT. It then binds the binary to its C launcher (binding.py):
every later call hands the arguments straight to it. On the CPU every call runs
Triton's interpreter.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from minicomp import logs
from minicomp.runtime import checks, tuning
from minicomp.runtime.ahead import Ahead
from minicomp.runtime.binding import aligned_positions, bind
from minicomp.runtime.launch_spec import LaunchSpec
from minicomp.runtime.records import Records, specializations

# Triton's interpreter patches triton.language module-wide while a kernel runs: two threads
# interpreting at once undo each other's patches ("Did you forget to add @triton.jit ?").
# Reentrant, so that a launch made on the thread that holds it (a signal handler, a GC callback
# or a `__del__` that calls a jitted function while a kernel is interpreted) never deadlocks: it
# raises Reentered instead, and its caller runs eagerly (the interpreter's state, such as the
# program id, is global: a kernel interpreted inside another would change the outer one's).
_INTERPRETER_LOCK = threading.RLock()
_interpreting = [False]  # a kernel is being interpreted (by the thread that holds the lock)


class Reentered(RuntimeError):
    """A kernel was launched on the CPU while this thread interprets another one (from a signal
    handler, a GC callback or a `__del__`): the jitted function runs eagerly instead."""


def interpreting() -> bool:
    """Is this thread inside an interpreted launch (so a jitted call it makes now must run eagerly)?"""
    if not _INTERPRETER_LOCK.acquire(blocking=False):
        return False  # another thread interprets: this one is not inside a launch
    try:
        return _interpreting[0]
    finally:
        _INTERPRETER_LOCK.release()


class Launch:
    """One kernel of a generated module, launched as cheaply as Triton allows."""

    def __init__(self, kernel, spec: LaunchSpec, device: str, checked: bool = False):
        self.kernel, self.spec, self.device = kernel, spec, torch.device(device)
        self.block_name, self.options = spec.block_name, spec.options
        if checked and self.device.type != "cpu":  # its device-side asserts (checks.py) compiled in
            self.options = {**self.options, **checks.COMPILE_OPTIONS}
        self.name = kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__
        self.records = Records(kernel, self.name, self.device, self.options)
        # the arguments Triton does not specialize on (a kernel family's sizes of mixed classes)
        params = getattr(kernel, "params", ())
        self.unspecialized = frozenset(i for i, p in enumerate(params) if getattr(p, "do_not_specialize", False))
        self.ahead = Ahead()
        self.config: tuning.Config | None = None
        self._fast = None  # the bound launcher, once the kernel is compiled
        self.times: dict[str, float] = {}  # the first call's tuning and compile (or load) seconds
        self.jit_compiled: bool | None = None  # its binary came through Triton's JIT (else from a record)
        self._first_call_compiled = False  # the first call compiled its binary itself (none ahead)
        self._lock = threading.Lock()

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
            return fast(*args)
        if self.device.type == "cpu":  # the interpreter: nothing to keep
            block, warps = self.heuristic()
            try:
                with _INTERPRETER_LOCK:
                    if _interpreting[0]:
                        raise Reentered(f"{self.name} was launched while this thread interprets another kernel")
                    _interpreting[0] = True
                    try:  # numpy computes masked-off lanes too (log of padding, 0/0): eager warns of none
                        with np.errstate(all="ignore"):
                            self.kernel[(self.grid(block),)](*args, **self.settings(block, warps))
                    finally:
                        _interpreting[0] = False
            except Exception as error:  # a failed check (checks.py) raises as eager does
                if (check := checks.failed(error)) is not None:
                    raise check from None
                raise
            return None
        return self._first_call(args)

    def grid(self, block: int) -> int:
        return self.spec.grid(block)

    def heuristic(self) -> tuning.Config:
        return self.spec.heuristic(self.device)

    def settings(self, block: int, warps: int) -> dict:
        """The keyword arguments of a launch (and of a compile) at (block, warps)."""
        return {self.block_name: block, "num_warps": warps, **self.options}

    @property
    def compiles(self) -> int:
        """Binaries Triton's JIT compiled for this kernel: ahead (every configuration tried) and on
        its first call (when none was compiled ahead)."""
        return self.ahead.compiles + self._first_call_compiled

    # -- configuration ------------------------------------------------------------
    def configs(self) -> list[tuning.Config]:
        return tuning.configs(self.spec, self.device, self.records)

    def choose(self, args) -> tuning.Config:
        """The launch configuration: of `configs` (as `prepare` found them, under the compile's
        settings, else now), the fastest on these arguments, remembered on disk."""
        return tuning.choose(self.ahead.configs or self.configs(), self.spec, self.records, self._time, args)

    def _time(self, config: tuning.Config, args) -> float:
        block, warps = config
        return tuning.time_config(self.kernel, self.grid(block), self.settings(block, warps), args)

    # -- compiling ahead ----------------------------------------------------------
    def prepare(self, signature: list) -> None:
        """Start compiling this kernel for a call with `signature` (each argument's torch.dtype
        for a tensor, the int itself for an integer), in threads (ahead.py)."""
        if self.device.type != "cuda" or self._fast is not None or self.ahead.tasks:
            return
        self.ahead.start(self, signature)

    # -- the first call -----------------------------------------------------------
    def _jit_launch(self, args):
        """Through Triton's JIT: it specializes on the arguments and caches the binaries."""
        block, warps = self.config
        return self.kernel[(self.grid(block),)](*args, **self.settings(block, warps))

    def _first_call(self, args):
        with self._lock, torch.cuda.device(self.device):
            start = time.perf_counter()
            self.ahead.wait()  # this kernel's compiles ahead (prepare)
            waited = time.perf_counter()
            if self.config is None:
                self.config = self.choose(args)
            tuned = time.perf_counter()
            aligned = aligned_positions(args)
            compiled, through_jit, ran = self._binary(args, aligned)
            self.times = {"tune": tuned - waited, "compile": (waited - start) + (time.perf_counter() - tuned)}
            self.jit_compiled = through_jit
            logs.cache.info(
                "%s: first call at %s x %s warps: %d Triton compiles, waited %.3f s for them, tuned %.3f s",
                self.name,
                *self.config,
                self.compiles,
                self.times["compile"],
                self.times["tune"],
            )
            block = self.config[0]
            fast = bind(compiled, self.grid(block), block, self.device.index or 0, aligned, self._jit_launch)
            if self._fast is None:
                self._fast = fast
        if not ran:
            fast(*args)
        return None

    def _binary(self, args, aligned: set[int]) -> tuple:
        """(compiled, through the JIT, whether this call already ran it) at `self.config`: compiled
        ahead, from a record, else through Triton's JIT, which runs this call."""
        found = specializations(args, self.unspecialized)
        ahead = self.ahead.binary(self.config, aligned, found)
        if ahead is not None:
            return (*ahead, False)
        path = self.records.binary_path(self.config, found)
        compiled = self.records.restore(path, aligned)
        if compiled is not None:
            return compiled, False, False
        compiled = self._jit_launch(args)  # Triton's JIT compiles (or loads its disk cache) and runs this call
        self._first_call_compiled = True
        self.records.remember(compiled, path, aligned)
        return compiled, True, True
