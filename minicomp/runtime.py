"""Where generated modules live and how they are loaded.

Triton reads a kernel's source from its file, so every module is written to a
file named after the hash of its text, in the cache directory, and imported
from there (never exec'd from a string). The same text always lands in the
same file: a second process finds it there and skips code generation.

Modules for CPU tensors are imported with Triton's interpreter switched on,
with numpy stand-ins for libdevice (interpreter_math.py).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from triton import knobs

_loaded: dict[tuple[str, bool], ModuleType] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp."""
    explicit = os.environ.get("MINICOMP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minicomp"


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def write_atomic(path: Path, text: str) -> None:
    """Write then rename: a reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def module_path(source: str, name: str) -> Path:
    stem = re.sub(r"\W", "_", name)[:40]
    return cache_dir() / "modules" / f"{stem}_{source_hash(source)}.py"


def load(source: str, name: str, interpret: bool) -> ModuleType:
    """Import the module whose text is `source` (written to the cache if needed)."""
    key = (source_hash(source), interpret)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        path = module_path(source, name)
        if not path.exists() or path.read_text() != source:  # absent, or truncated/corrupted
            write_atomic(path, source)
        _debug_copy(source, name)
        module = _import(path, interpret)
        _loaded[key] = module
        return module


def _import(path: Path, interpret: bool) -> ModuleType:
    mod_name = f"minicomp_generated.{path.stem}{'_interp' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    with knobs.runtime.scope():
        knobs.runtime.interpret = interpret
        spec.loader.exec_module(module)
    if interpret:
        from minicomp.interpreter_math import libdevice

        module.libdevice = libdevice
    sys.modules[mod_name] = module
    return module


def _debug_copy(source: str, name: str) -> None:
    """MINICOMP_DEBUG_DIR=dir: also keep each module as dir/<function>_<hash>.py."""
    debug = os.environ.get("MINICOMP_DEBUG_DIR")
    if debug:
        target = Path(debug) / module_path(source, name).name
        if not target.exists():
            write_atomic(target, source)
