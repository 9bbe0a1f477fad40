"""Where generated modules live and how they are loaded.

Triton reads a kernel's source from its file, so every module is written to a
file named after the hash of its text, in the cache directory, and imported
from there (never exec'd from a string). The same text always lands in the
same file: a second process finds it there and skips code generation.

Modules for CPU tensors are imported with Triton's interpreter switched on,
with numpy stand-ins for libdevice (interpreter_math.py).
"""
from __future__ import annotations

import functools
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

from minicomp import logs

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


@functools.lru_cache(maxsize=None)
def compiler_hash() -> str:
    """A hash of minicomp's own source and templates: a changed compiler never reuses old entries."""
    from minicomp.codegen.module import TEMPLATES

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")) + sorted(TEMPLATES.glob("*.j2")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:20]


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
        if not path.exists():
            logs.cache.info("module %s: written", path.name)
            write_atomic(path, source)
        elif path.read_text() != source:
            logs.cache.warning("module %s is damaged (text differs from its hash); rewritten", path.name)
            write_atomic(path, source)
        else:
            logs.cache.info("module %s: reused", path.name)
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


# -- `minicomp cache info | clear` ------------------------------------------------

CACHE_PARTS = {
    "modules": "generated modules (Triton kernels + wrapper), named <function>_<text hash>.py",
    "entries": "persistent index: (function fingerprint, signature) -> module",
    "tuning": "measured launch configurations of large GPU kernels",
}


def cache_info() -> str:
    lines = [f"minicomp cache: {cache_dir()}"]
    for part, what in CACHE_PARTS.items():
        files = [p for p in (cache_dir() / part).glob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        lines.append(f"  {part:8} {len(files):6} files {size / 1024:10.1f} KiB   {what}")
    lines.append(f"Triton's compiled kernels: {knobs.cache.dir} (TRITON_CACHE_DIR)")
    return "\n".join(lines)


def clear_cache() -> int:
    """Delete minicomp's cached files (not Triton's); returns how many were removed."""
    import shutil

    removed = 0
    for part in CACHE_PARTS:
        folder = cache_dir() / part
        if folder.is_dir():
            removed += sum(1 for p in folder.rglob("*") if p.is_file())
            shutil.rmtree(folder)
    with _lock:
        _loaded.clear()
    return removed
