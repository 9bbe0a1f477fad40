"""`python -m MODULE ARGS...` run in a process forked from one that imported torch and Triton already.

The experiments' smoke runs (tests/tools/test_experiments.py) are a fresh process each, and about
4 s of each on a 2-core machine was importing torch and Triton. A `Preloaded` server (one per
pytest worker) imports them once; each run is a child forked from it that takes the run's
environment, working directory and `sys.path`, runs the module as `__main__` with its output in
a file, and exits as the interpreter would (threads joined, atexit handlers run). What a child
shares with its siblings: string hashing's seed, `sys.flags` and what torch and Triton read from
the environment at their import (Triton reads TRITON_INTERPRET when a kernel is defined), so a test of what a *fresh
interpreter* does (a cache served to a second process, what an import loads) keeps starting one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import atexit, json, os, runpy, signal, sys, threading, time, traceback
import torch, triton  # the preload

base_path = sys.path[1:]  # ("-c" put the working directory first; each run puts its own)
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:] = [job["cwd"], *extra, *base_path]
            sys.argv = [job["module"], *job["args"]]
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                threading._shutdown()  # as the interpreter's exit: non-daemon threads joined, then atexit
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline, timed_out = time.monotonic() + job["timeout"], False
    while True:  # (killed here, before it is reaped: its pid cannot have gone to another process)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if not timed_out and time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.02)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "timed_out": timed_out}), flush=True)
"""


@dataclass(frozen=True)
class Finished:
    returncode: int  # as subprocess reports it: negative for a signal
    output: str  # stdout and stderr, interleaved
    timed_out: bool


class Preloaded:
    """A server process that forks a child per `run`, one run at a time, and kills a run that
    passes its time limit."""

    def __init__(self):
        self._server: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def run(self, module: str, args: list[str], *, env: dict, cwd: Path, log: Path, timeout: float) -> Finished:
        with self._lock:
            server = self._started()
            job = dict(module=module, args=args, env=env, cwd=str(cwd), log=str(log), timeout=timeout)
            server.stdin.write(json.dumps(job) + "\n")
            server.stdin.flush()
            reply = server.stdout.readline()  # the server kills a run at its time limit
            if not reply:
                raise RuntimeError(f"the preloaded server exited ({server.wait()}) while running {module}")
            done = json.loads(reply)
            output = log.read_text(errors="replace") if log.exists() else ""
            return Finished(done["code"], output, timed_out=done["timed_out"])

    def close(self) -> None:
        if self._server is not None:
            self._server.stdin.close()
            self._server.wait(timeout=30)
            self._server = None

    def _started(self) -> subprocess.Popen:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        return self._server
