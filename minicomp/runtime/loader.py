"""Loading generated modules: from text minicomp verified, never from whatever is on disk.

Triton reads a kernel's source through `inspect` (linecache), so every module
is also written to a file named after the hash of its text in the cache
(`<cache>/modules`, cache.py) and its line cache is filled with that same
verified text. The module itself is compiled from the text in memory: no
`.pyc` is written or read, and a file changed on disk after the check is
never what runs. The same text always lands in the same file: a second
process finds it there (persist.py) and skips code generation.

Modules for CPU tensors are imported with Triton's interpreter switched on,
with numpy stand-ins for libdevice (interpreter_math.py).
"""

from __future__ import annotations

import hashlib
import linecache
import re
import sys
import threading
import types
from pathlib import Path

from triton import knobs

from minicomp import logs
from minicomp.runtime import cache

_loaded: dict[tuple[str, bool], types.ModuleType] = {}
_lock = threading.RLock()  # reentrant: a signal handler may compile while this thread loads


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def module_name(source: str, name: str) -> str:
    """`<function>_<text hash>.py`: only [A-Za-z0-9_] from the function's name."""
    stem = re.sub(r"[^A-Za-z0-9_]", "_", name)[:40] or "fn"
    return f"{stem}_{source_hash(source)}.py"


def module_path(source: str, name: str) -> Path:
    return cache.file("modules", module_name(source, name))


def load(source: str, name: str, interpret: bool) -> types.ModuleType:
    """The module whose text is `source` (written to the cache if the file is absent or differs)."""
    key = (source_hash(source), interpret)
    with _lock:
        path = module_path(source, name)
        if key in _loaded and cache.is_file(path):  # a cleared cache gets the file back
            return _loaded[key]
        on_disk = cache.read_text(path)
        if on_disk is None:
            logs.cache.info("module %s: written", path.name)
            cache.write_atomic(path, source)
        elif on_disk != source:
            logs.cache.warning("module %s is damaged (text differs from its hash); rewritten", path.name)
            cache.write_atomic(path, source)
        else:
            logs.cache.info("module %s: reused", path.name)
        cache.debug_copy(path.name, source)
        if key not in _loaded:
            _loaded[key] = _import(source, path, interpret)
        return _loaded[key]


def _import(source: str, path: Path, interpret: bool) -> types.ModuleType:
    mod_name = f"minicomp_generated.{path.stem}{'_interp' if interpret else ''}"
    filename = str(path)
    # inspect (hence Triton) reads kernel sources through linecache: give it the verified text;
    # an entry without a modification time is never re-read from disk (linecache.checkcache).
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(mod_name)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    with knobs.runtime.scope():
        knobs.runtime.interpret = interpret
        exec(code, module.__dict__)  # noqa: S102 - minicomp's own generated text, verified above
    if interpret:
        from minicomp.runtime import checks, interpreter_index, interpreter_reduce
        from minicomp.runtime.interpreter_math import libdevice

        checks.enable()  # its kernels' device-side asserts (checks.py) run
        interpreter_index.enable()  # a runtime size as a loop bound
        interpreter_reduce.enable()  # a reduction's own combine function as a tree, not per element

        module.libdevice = libdevice
    sys.modules[mod_name] = module
    return module


def forget_loaded() -> None:
    """Drop the modules and binaries this process loaded (tests: the next load imports from disk)."""
    from minicomp.runtime import records

    with _lock:
        _loaded.clear()
    records.forget_restored()
