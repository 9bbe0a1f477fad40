"""Python's cyclic garbage collector paused while minicomp compiles.

A compile allocates millions of short-lived objects (ATen graphs, IR nodes, syntax trees of the
generated text), so the collector's thresholds are crossed again and again, and now and then it
runs a full collection, which walks every object of the process: with torch, Dynamo and a model
loaded, 0.5-0.9 s each on the CPU machine, several a first call (docs/experiments.md). Paused
for the compile, the collector runs fewer full collections in all: the compile's objects either
die by reference counting or live on, and cyclic garbage waits for the next collection after it.

The pause is process-wide (the collector is): overlapping compiles in several threads keep it
paused until the last one ends, and it is switched back on only where it was on when the first
one began; a child process forked meanwhile starts with no pause. Config "pause_gc" (default on)
turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import threading

_lock = threading.RLock()  # (reentrant: a signal handler may compile while its thread holds it)
_depth = 0  # compiles inside `paused` now, in any thread
_restore = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def paused(enabled: bool = True):
    """The collector off inside the block (when `enabled`: config "pause_gc")."""
    global _depth, _restore
    if not enabled:
        yield
        return
    entered = False
    try:
        with _lock:
            if _depth == 0:
                _restore = gc.isenabled()
                gc.disable()
            _depth += 1
            entered = True
        yield
    finally:
        if entered:
            with _lock:
                _depth -= 1
                if _depth == 0 and _restore:
                    gc.enable()


def _after_fork_in_child() -> None:
    """A child forked while a thread of the parent compiled: that compile never ends in the child,
    so the child starts with no pause (the collector on again where the pause had switched it off)."""
    global _depth, _lock
    _lock = threading.RLock()
    if _depth and _restore:
        gc.enable()
    _depth = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def pausing(function):
    """`function` run with the collector paused where config "pause_gc" is on (read at each call)."""
    from minicomp import config

    @functools.wraps(function)
    def run(*args, **kwargs):
        with paused(config.get("pause_gc")):
            return function(*args, **kwargs)

    return run
