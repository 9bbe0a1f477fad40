"""Worker processes that compile kernels for the compile threads (compile_pool.py, ahead.py).

A compile thread asks `compile_in_worker` first: the specialization Triton's JIT
would compile for the call's argument types is serialized as `JITFunction.preload`
takes it (the JIT's own binder and packing, without compiling), handed to an idle
worker process (compile_worker.py: Triton only, no torch), and the worker
compiles it into Triton's cache. The thread's own `warmup` then loads that binary
as a cache hit. Anything that fails (a worker that dies, hangs or says something
else than a reply, a kernel the worker cannot load, a cache key that differs)
only costs the time: the thread's `warmup` compiles as it would without workers.
No Triton setting is changed in this process; where one would make the worker's
binary differ from this process's (a stages inspection hook), nothing is handed
over.

MINICOMP_COMPILE_PROCESSES workers (default: as many as compile threads, at most
16; 0: the threads compile themselves), started by the first request once config
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
from minicomp.runtime.compile_worker import read_frame, triton_fingerprint, write_frame

WORKER_FILE = str(Path(__file__).with_name("compile_worker.py"))
# by path, the working directory off sys.path: neither the package nor a local file is imported
_COMMAND = [
    sys.executable,
    "-c",
    "import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\n"  # (-c's working directory)
    "import runpy\nrunpy.run_path(sys.argv[1], run_name='__main__')",
    WORKER_FILE,
]
START_LIMIT = 20.0  # seconds a worker may take to get ready before it is given up
ASK_LIMIT = 600.0  # seconds a compile may take in a worker before it is given up


class WorkerFailed(RuntimeError):
    """A worker process died, hung or broke its protocol."""


def _readable(files: list, timeout: float) -> list:
    """Those of `files` with something to read (or closed) within `timeout` seconds (poll: any
    file descriptor number)."""
    poller = select.poll()
    for f in files:
        poller.register(f, select.POLLIN | select.POLLHUP | select.POLLERR)
    ready = {fd for fd, _ in poller.poll(max(0, int(timeout * 1000)))}
    return [f for f in files if f.fileno() in ready]


class Worker:
    """One compile process and its pipes."""

    def __init__(self):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)  # (set while a CPU module is imported: loader.py)
        self.process = subprocess.Popen(  # noqa: S603 - this interpreter running minicomp's own file
            _COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True, env=env
        )
        self.started, self.ready = time.monotonic(), False

    def poll_ready(self) -> bool:
        """Whether the worker has said it is ready (its first reply), without waiting;
        WorkerFailed if it died first or has taken START_LIMIT seconds."""
        if self.ready:
            return True
        try:
            said = self._read() if _readable([self.process.stdout], 0) else None
        except (OSError, ValueError) as err:
            raise WorkerFailed(f"{type(err).__name__}: {err}") from err
        if said is None:
            if time.monotonic() - self.started > START_LIMIT:
                raise WorkerFailed(f"not ready after {START_LIMIT:.0f} s")
            return False
        if said != {"ready": True}:
            raise WorkerFailed(f"said {said!r} before its first request")
        self.ready = True
        return True

    def ask(self, request: dict) -> dict:
        try:
            write_frame(self.process.stdin, request)
            answered = _readable([self.process.stdout], ASK_LIMIT)
        except (OSError, ValueError) as err:
            raise WorkerFailed(f"{type(err).__name__}: {err}") from err
        if not answered:
            raise WorkerFailed(f"no reply in {ASK_LIMIT:.0f} s")
        return self._read()

    def _read(self) -> dict:
        try:
            reply = read_frame(self.process.stdout)
        except Exception as err:  # noqa: BLE001 - a cut, huge or unpicklable frame: the worker is lost
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

    def expect(self, tasks: int) -> None:
        """`tasks` more compiles were handed to the compile threads; from config
        "compile_processes_from" outstanding on (read in the caller's thread, under its
        overrides), the workers are wanted (started by the next request)."""
        enough = config.get("compile_processes_from")
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
        """Start the workers and wait until each is ready, lost, or `timeout` seconds have passed:
        whether one is ready (experiments that time warm workers; tests)."""
        self.prestart()
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                starting = self._poll_idle()
                ready = any(w.ready for w in self.idle)
            if not starting or time.monotonic() >= deadline:
                return ready
            with contextlib.suppress(OSError, ValueError):  # (one that died: found by the next poll)
                _readable(starting, min(0.1, max(0.0, deadline - time.monotonic())))

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
                starting = self._poll_idle()
                for worker in reversed(self.idle):
                    if worker.ready:
                        self.idle.remove(worker)
                        return worker
            if not starting or time.monotonic() > deadline:
                return None  # all busy or lost, or none ready in time
            with contextlib.suppress(OSError, ValueError):
                _readable(starting, 0.05)

    def _poll_idle(self) -> list:
        """(under the lock) Each idle worker's readiness polled, the failed ones lost: the outputs
        of those still starting."""
        starting = []
        for worker in list(self.idle):
            try:
                if not worker.poll_ready():
                    starting.append(worker.process.stdout)
            except WorkerFailed as err:
                logs.cache.info("compile worker lost (%s)", err)
                self._lose(worker)
        return starting

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
    from triton import JITFunction, knobs

    pool = workers()
    if pool is None or target is None or not isinstance(kernel, JITFunction) or not pool.wanted:
        return False
    if knobs.runtime.add_stages_inspection_hook is not None:  # it would not run in the worker
        return False
    fn = kernel.fn
    try:
        specialization = serialized(kernel, signature, settings)
        if specialization is None:  # compiled in this process already
            return False
        request = {
            "path": fn.__code__.co_filename,
            "module": fn.__module__,
            "kernel": fn.__name__,
            "specialization": specialization,
            "target": (target.backend, target.arch, target.warp_size),
            "cache_dir": knobs.cache.dir,
            "triton": _this_triton(),
        }
        reply = pool.ask(request)
    except Exception as err:  # noqa: BLE001 - the caller's own warmup compiles (and reports what fails)
        logs.cache.info("%s: not compiled in a worker (%s: %s)", fn.__name__, type(err).__name__, err)
        return False
    if reply is None:
        logs.cache.info("%s: no compile worker ready; compiling here", fn.__name__)
        return False
    if not reply.get("ok"):
        logs.cache.info("%s: compile worker could not (%s); compiling here", fn.__name__, reply.get("error"))
        return False
    logs.cache.info("%s: compiled in a worker in %.3f s", fn.__name__, reply["seconds"])
    return True


def _this_triton() -> tuple:
    """(this process's Triton fingerprint, its installation hash `triton_key`: computed once, in
    compile_pool.start_triton's task; a worker with the same fingerprint uses it)."""
    from triton.runtime.cache import triton_key

    return triton_fingerprint(), triton_key()


def serialized(kernel, signature: list, settings: dict) -> str | None:
    """`preload`'s data for `kernel.warmup(*signature, **settings)` on the current device, made as
    Triton's JIT makes it before a compile (`JITFunction.run`, `_call_hook`), without compiling;
    None when this process has that binary already."""
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import MockTensor, compute_cache_key, get_full_name, serialize_specialization_data

    options = dict(settings)
    options["debug"] = options.get("debug", kernel.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kernel_cache, key_cache, _, backend, binder = kernel.device_caches[driver.active.get_current_device()]
    bound, specialization, parsed = binder(*map(MockTensor.wrap_dtype, signature), **options)  # (as warmup)
    key = compute_cache_key(key_cache, specialization, parsed)
    if key in kernel_cache:
        return None
    parsed, types, constants, attrs = kernel._pack_args(backend, options, bound, specialization, parsed)
    return serialize_specialization_data(get_full_name(kernel.fn), types, constants, attrs, parsed, key)
