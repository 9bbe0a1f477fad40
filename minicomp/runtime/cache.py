"""minicomp's on-disk cache: its layout, who may write it, and reading and writing its files.

    <cache>/modules/<function>_<text hash>.py   generated modules (runtime.py imports them)
    <cache>/entries/<key>.json                  (function fingerprint, signature) -> module (persist.py)
    <cache>/kernels/<kernel>_<key>.json         where a compiled binary lies in Triton's cache (records.py)
    <cache>/tuning/<key>.json                   measured launch configurations (records.py)

The cache holds code that minicomp runs, so it is treated like Triton's and
Inductor's per-user caches: a directory that is not owned by this user, or
that group or others may write, is refused with one warning, and this process
uses a private temporary directory instead (nothing persists). Inside it, a
part that is not a real directory (a file, a symlink) is replaced by one, and
a file name read from an entry must be a plain name inside the part.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from minicomp import config

PARTS = {
    "modules": "generated modules (Triton kernels + wrapper), named <function>_<text hash>.py",
    "entries": "persistent index: (function fingerprint, signature) -> module",
    "kernels": "where each compiled GPU binary lies in Triton's cache (a second process skips Triton's JIT)",
    "tuning": "measured launch configurations of large GPU kernels",
}
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,150}")  # a file name minicomp writes: no separators
_checked: dict[Path, Path] = {}  # configured dir -> the dir used (itself, or a private one if refused)
_lock = threading.Lock()


def root() -> Path:
    """The cache directory this process uses: MINICOMP_CACHE_DIR (config.cache_dir) once it
    is checked to be safe, else a private temporary one."""
    wanted = config.cache_dir()
    used = _checked.get(wanted)
    if used is None:
        with _lock:
            used = _checked.get(wanted) or _checked.setdefault(wanted, _check(wanted))
    return used


def _check(path: Path) -> Path:
    problem = None
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        problem = unsafe(path)
    except OSError as err:
        problem = f"it cannot be created ({err.strerror})"
    if problem is None:
        return path
    private = Path(tempfile.mkdtemp(prefix="minicomp-"))
    warnings.warn(
        f"minicomp: not using the cache directory {path}: {problem}. Code in it could be run by "
        f"this process. Using the private directory {private} for this process instead (nothing "
        "persists); point MINICOMP_CACHE_DIR at a directory only you can write.",
        stacklevel=4,
    )
    return private


def unsafe(path: Path) -> str | None:
    """Why `path` (a directory) is no place for code this user runs, or None."""
    if not hasattr(os, "getuid"):  # no POSIX ownership (Windows): nothing to check
        return None
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it belongs to user id {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def part(name: str) -> Path:
    """`<cache>/<name>`, a real directory of this user's (a file or symlink in its place is replaced)."""
    path = root() / name
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.mkdir(mode=0o700, exist_ok=True)
        return path
    if stat.S_ISDIR(st.st_mode) and (not hasattr(os, "getuid") or st.st_uid == os.getuid()):
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            path.chmod(0o700)
        return path
    _remove(path)
    path.mkdir(mode=0o700)
    return path


def file(part_name: str, name: str) -> Path:
    """The file `name` of a part; `name` must be a plain file name (never a path out of the cache)."""
    if not SAFE_NAME.fullmatch(name) or name.startswith(".."):
        raise ValueError(f"{name!r} is not a file name minicomp writes")
    return part(part_name) / name


def read_text(path: Path) -> str | None:
    """The text of a regular file, or None when it is absent or is not one (a directory, a symlink,
    undecodable bytes): every caller treats None as a miss and writes the file again."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write_atomic(path: Path, text: str) -> None:
    """Write then rename: a reader sees the old file or the whole new one. Whatever stands at
    `path` and is not a regular file (a directory, a symlink) is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        _remove(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def debug_copy(name: str, text: str) -> None:
    """MINICOMP_DEBUG_DIR=dir: also keep each module as dir/<name> (written once)."""
    debug = config.debug_dir()
    if debug is not None:
        target = debug / name
        if not target.exists():
            write_atomic(target, text)


# -- `minicomp cache info | clear` ------------------------------------------------


def info() -> str:
    from triton import knobs

    lines = [f"minicomp cache: {root()}"]
    for name, what in PARTS.items():
        folder = root() / name
        files = [p for p in folder.glob("*") if p.is_file()] if folder.is_dir() and not folder.is_symlink() else []
        size = sum(p.stat().st_size for p in files)
        lines.append(f"  {name:8} {len(files):6} files {size / 1024:10.1f} KiB   {what}")
    lines.append(f"Triton's compiled kernels: {knobs.cache.dir} (TRITON_CACHE_DIR)")
    return "\n".join(lines)


def clear() -> int:
    """Delete minicomp's cached files (not Triton's); returns how many were removed.
    A symlink standing for a part is removed itself, never followed. (A module this process
    already loaded is written again the next time it is compiled: runtime.load.)"""
    removed = 0
    for name in PARTS:
        folder = root() / name
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
            removed += 1
        elif folder.is_dir():
            removed += sum(1 for p in folder.rglob("*") if p.is_file() or p.is_symlink())
            shutil.rmtree(folder)
    return removed
