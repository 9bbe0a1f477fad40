"""Worker processes that compile kernels for the compile threads (compile_pool.py, ahead.py).

A compile thread asks `compile_in_worker` first: it has Triton's JIT serialize
the kernel's specialization for the call's argument types (through Triton's
`jit_cache_hook`, which then skips the compile), hands it to an idle worker
process (compile_worker.py: Triton only, no torch) and waits; the worker
compiles into Triton's cache. The thread's own `warmup` then loads that binary
as a cache hit. Anything that fails (a worker that dies, a kernel the worker
cannot load, a cache key that differs) only costs the time: the thread's
`warmup` compiles as it would without workers.

MINICOMP_COMPILE_PROCESSES workers (default: as many as compile threads; 0:
the threads compile themselves), started by the first request once config
"compile_processes_from" compiles are outstanding (a small function's kernel or
two compile in their threads at once, not after a worker's start), and kept for
the process; each exits at the end of its input (this process's exit included).
Workers belong to the process that started them: a forked child starts its own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from minicomp import config, logs
from minicomp.runtime.compile_worker import read_frame, write_frame

WORKER_FILE = str(Path(__file__).with_name("compile_worker.py"))
# run by path under -c: neither the package nor the file's folder is put on sys.path
_COMMAND = [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", WORKER_FILE]


class WorkerFailed(RuntimeError):
    """A worker process died or broke its protocol."""


class Worker:
    """One compile process and its pipes."""

    def __init__(self):
        self.process = subprocess.Popen(  # noqa: S603 - this interpreter running minicomp's own file
            _COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True
        )
        self.ready = False

    def poll_ready(self, timeout: float = 0.0) -> bool:
        """Whether the worker has said it is ready (its first reply), waiting at most `timeout`
        seconds; WorkerFailed if it died first."""
        try:
            readable = self.ready or select.select([self.process.stdout], [], [], timeout)[0]
        except (OSError, ValueError) as err:  # (a pipe select cannot wait on, a closed one)
            raise WorkerFailed(f"{type(err).__name__}: {err}") from err
        if not self.ready and readable:
            said = self._read()
            if said != {"ready": True}:
                raise WorkerFailed(f"said {said!r} before its first request")
            self.ready = True
        return self.ready

    def ask(self, request: dict) -> dict:
        try:
            write_frame(self.process.stdin, request)
        except (OSError, ValueError) as err:
            raise WorkerFailed(f"{type(err).__name__}: {err}") from err
        return self._read()

    def _read(self) -> dict:
        try:
            reply = read_frame(self.process.stdout)
        except (OSError, ValueError, EOFError) as err:
            raise WorkerFailed(f"{type(err).__name__}: {err}") from err
        if not isinstance(reply, dict):
            raise WorkerFailed(f"exited with {self.process.poll()}")
        return reply

    def close(self, wait: float = 1.0) -> None:
        """End the process: its input closed (it exits), killed if not gone within `wait` seconds."""
        try:
            self.process.stdin.close()
            self.process.wait(wait)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.process.wait(1.0)


class Workers:
    """Up to `limit` workers, one request at a time each, started once enough compiles are
    outstanding (`expect`): a small function's kernel or two compile in their threads at once,
    rather than wait for a worker to start. A request takes a ready idle worker, waiting at most
    READY_WAIT seconds for one still starting; else `ask` returns None and the caller compiles.
    Workers that die are replaced, `limit` times at most."""

    READY_WAIT = 2.0  # seconds (a worker is ready about 0.2 s after it starts)

    def __init__(self, limit: int):
        self.limit, self.lost, self.pid = limit, 0, os.getpid()
        self.idle: list[Worker] = []  # started, not asked now (ready or still importing Triton)
        self.all: list[Worker] = []
        self.pending, self.wanted = 0, False
        self.lock = threading.Lock()

    def expect(self, tasks: int, enough: int) -> None:
        """`tasks` more compiles were handed to the compile threads; from `enough` outstanding
        on, the workers are wanted (started by the next request)."""
        with self.lock:
            self.pending += tasks
            self.wanted = self.wanted or self.pending >= enough

    def finished(self) -> None:
        """One of the expected compiles is done (or needed none)."""
        with self.lock:
            self.pending -= 1

    def prestart(self) -> None:
        """Start the workers not running (each imports Triton meanwhile)."""
        with self.lock:
            self.wanted = True
            while len(self.all) < self.limit and self.lost < self.limit:
                try:
                    worker = Worker()
                except OSError as err:
                    logs.cache.info("compile worker not started (%s: %s)", type(err).__name__, err)
                    self.lost = self.limit
                    return
                self.all.append(worker)
                self.idle.append(worker)

    def wait_ready(self, timeout: float) -> bool:
        """Start the workers and wait until each is ready or `timeout` seconds have passed:
        whether one is ready (experiments that time warm workers; tests)."""
        self.prestart()
        deadline = time.monotonic() + timeout
        with self.lock:
            for worker in list(self.idle):
                try:
                    worker.poll_ready(max(0.0, deadline - time.monotonic()))
                except WorkerFailed:
                    self._lose(worker)
            return any(w.ready for w in self.idle)

    def ask(self, request: dict) -> dict | None:
        """The reply of a ready idle worker to `request`, or None when none is wanted or ready."""
        worker = self._take()
        if worker is None:
            return None
        try:
            reply = worker.ask(request)
        except WorkerFailed:
            with self.lock:
                self._lose(worker)
            raise
        with self.lock:
            self.idle.append(worker)
        return reply

    def _take(self) -> Worker | None:
        if not self.wanted:
            return None
        self.prestart()
        deadline = time.monotonic() + self.READY_WAIT
        while True:
            with self.lock:
                for worker in reversed(self.idle):
                    try:
                        ready = worker.poll_ready()
                    except WorkerFailed:
                        self._lose(worker)
                        break  # (the list changed: look again)
                    if ready:
                        self.idle.remove(worker)
                        return worker
                starting = [w.process.stdout for w in self.idle if not w.ready]
            if not starting or time.monotonic() > deadline:
                return None  # all busy or lost, or none ready in time
            with contextlib.suppress(OSError, ValueError):  # (one that died: found by the next poll)
                select.select(starting, [], [], 0.05)

    def _lose(self, worker: Worker) -> None:
        """(under the lock)"""
        worker.close(wait=0)
        self.lost += 1
        for workers in (self.all, self.idle):
            if worker in workers:
                workers.remove(worker)

    def close(self, wait: float = 1.0) -> None:
        """End the workers: their input closed, then killed if not gone within `wait` seconds
        in all. Only in the process that started them (a forked child's exit leaves them be)."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            workers, self.all, self.idle = self.all, [], []
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.process.stdin.close()
        deadline = time.monotonic() + wait
        for worker in workers:
            worker.close(wait=max(0.0, deadline - time.monotonic()))


_WORKERS: Workers | None = None
_WORKERS_LOCK = threading.Lock()


def workers() -> Workers | None:
    """This process's workers (None: MINICOMP_COMPILE_PROCESSES is 0)."""
    global _WORKERS
    with _WORKERS_LOCK:
        if _WORKERS is None or _WORKERS.pid != os.getpid():
            limit = config.compile_processes()
            if limit == 0:
                return None
            _WORKERS = Workers(limit)
            atexit.register(_WORKERS.close)
        return _WORKERS


def compile_in_worker(kernel, signature: list, settings: dict, target) -> bool:
    """Compile `kernel` (a @triton.jit function of a loaded generated module) for a call with
    `signature` (warmup's arguments) and `settings` into Triton's cache in a worker process,
    for `target` (Triton's GPUTarget; None: none known): whether a worker did. The caller's
    `warmup` follows."""
    from triton import JITFunction

    pool = workers()
    if pool is None or target is None or not isinstance(kernel, JITFunction):
        return False
    try:
        specialization = serialized(kernel, signature, settings)
    except Exception as err:  # noqa: BLE001 - the caller's own warmup meets it again and reports it
        logs.cache.info("%s: not handed to a worker (%s: %s)", kernel.fn.__name__, type(err).__name__, err)
        return False
    if specialization is None:
        return False
    import triton
    from triton import knobs
    from triton.runtime.cache import triton_key

    fn = kernel.fn
    request = {
        "path": fn.__code__.co_filename,
        "module": fn.__module__,
        "kernel": fn.__name__,
        "specialization": specialization,
        "target": (target.backend, target.arch, target.warp_size),
        "cache_dir": knobs.cache.dir,
        "triton": (triton.__file__, triton_key()),  # (computed once: compile_pool.start_triton)
    }
    try:
        reply = pool.ask(request)
    except WorkerFailed as err:
        logs.cache.info("%s: compile worker failed (%s); compiling here", fn.__name__, err)
        return False
    if reply is None:
        logs.cache.info("%s: no compile worker ready; compiling here", fn.__name__)
        return False
    if not reply.get("ok"):
        logs.cache.info("%s: compile worker could not (%s); compiling here", fn.__name__, reply.get("error"))
        return False
    logs.cache.info("%s: compiled in a worker in %.3f s", fn.__name__, reply["seconds"])
    return True


# -- the specialization Triton's JIT would compile -----------------------------------------
_capture = threading.local()
_hook_lock = threading.Lock()


def serialized(kernel, signature: list, settings: dict) -> str | None:
    """`preload`'s data for `kernel.warmup(*signature, **settings)`, taken from Triton's
    `jit_cache_hook` without compiling; None when it was not asked (a kernel this process has
    already compiled for these arguments, or another hook installed over this one)."""
    _install_hook()
    _capture.active, _capture.data = True, None
    try:
        kernel.warmup(*signature, grid=(1,), **settings)
    finally:
        _capture.active = False
    return _capture.data


def _install_hook() -> None:
    from triton import knobs

    with _hook_lock:
        current = knobs.runtime.jit_cache_hook
        if getattr(current, "minicomp_capture", False):
            return

        def hook(**kwargs):
            if getattr(_capture, "active", False):
                _capture.data = kwargs["compile"]["specialization_data"]
                return True  # no compile here: a worker makes it
            return current(**kwargs) if current is not None else None

        hook.minicomp_capture = True
        knobs.runtime.jit_cache_hook = hook
