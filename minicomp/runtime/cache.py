"""minicomp's on-disk cache: its layout, who may write it, and reading and writing its files.

    <cache>/modules/<function>_<text hash>.py   generated modules (runtime.py imports them)
    <cache>/entries/<key>.json                  (function fingerprint, signature) -> module (persist.py)
    <cache>/kernels/<kernel>_<key>.json         where a compiled binary lies in Triton's cache (records.py)
    <cache>/tuning/<key>.json                   measured launch configurations (records.py)

The cache holds code that minicomp runs, so it is treated like Triton's and
Inductor's per-user caches: a directory that is not owned by this user, or
that group or others may write, is refused with one warning, and this process
uses a private temporary directory instead (nothing persists). The check is
made on a file descriptor of the directory, which every later read and write
goes through (`dir_fd`, never following a symlink): re-pointing a symlink on
the path after the check redirects nothing. Inside it, a part that is not a
real directory (a file, a symlink) is replaced by one, and a file name read
from an entry must be a plain name inside the part. Records (entries, kernel
and tuning records) carry a checksum of their content, verified on read: one
changed on disk (a bad disk, another version, an edit) is a miss. `cache clear`
removes the files minicomp names (OWN), never anything else in its folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
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
_HEX20, _TEMP = "[0-9a-f]{20}", r"\.[0-9A-Za-z_]{8}\.tmp"
_OWN_NAMES = {  # the names minicomp gives the files of each part (what `clear` removes)
    "modules": rf"[A-Za-z0-9_]{{1,40}}_{_HEX20}\.py",
    "entries": r"[0-9a-f]{32}\.json",
    "kernels": rf"[A-Za-z0-9_]{{1,200}}_{_HEX20}\.json",
    "tuning": rf"{_HEX20}\.json",
}
OWN = {part: re.compile(rf"{name}|\.{name}{_TEMP}") for part, name in _OWN_NAMES.items()}  # with temporaries
RECORD_FORMAT = 1  # the layout of a record: one of another layout is a miss
_checked: dict[Path, tuple[Path, int]] = {}  # configured dir -> (the dir used, a descriptor of it)
_lock = threading.RLock()  # reentrant: a signal handler may compile while this thread holds it


def root() -> Path:
    """The cache directory this process uses: MINICOMP_CACHE_DIR (config.cache_dir) once it
    is checked to be safe, else a private temporary one."""
    return _used()[0]


def _used() -> tuple[Path, int]:
    wanted = config.cache_dir()
    used = _checked.get(wanted)
    if used is None:
        with _lock:
            used = _checked.get(wanted) or _checked.setdefault(wanted, _check(wanted))
    return used


def _check(path: Path) -> tuple[Path, int]:
    """(path, a descriptor of the directory checked): every file of the cache is reached through
    the descriptor, so the directory written is the one checked whatever its path points at later."""
    problem = None
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        problem = _unsafe(os.fstat(fd))
        if problem is None:
            return path, fd
        os.close(fd)
    except OSError as err:
        problem = f"it cannot be created ({err.strerror})"
    private = Path(tempfile.mkdtemp(prefix="minicomp-"))
    warnings.warn(
        f"minicomp: not using the cache directory {path}: {problem}. Code in it could be run by "
        f"this process. Using the private directory {private} for this process instead (nothing "
        "persists); point MINICOMP_CACHE_DIR at a directory only you can write.",
        stacklevel=5,
    )
    return private, os.open(private, os.O_RDONLY | os.O_DIRECTORY)


def unsafe(path: Path) -> str | None:
    """Why `path` (a directory) is no place for code this user runs, or None."""
    return _unsafe(path.stat())


def _unsafe(st: os.stat_result) -> str | None:
    if not hasattr(os, "getuid"):  # no POSIX ownership (Windows): nothing to check
        return None
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it belongs to user id {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def part(name: str) -> Path:
    """`<cache>/<name>`, a real directory of this user's (a file or symlink in its place is replaced)."""
    os.close(_part_fd(name))
    return root() / name


def _part_fd(name: str) -> int:
    """A descriptor of the part `name`, opened from the checked directory's (the caller closes it)."""
    root_fd = _used()[1]
    if os.fstat(root_fd).st_nlink == 0:  # the directory was removed (rm -rf): check its path anew
        with _lock:
            _checked.pop(config.cache_dir(), None)
        root_fd = _used()[1]
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            _remove_at(root_fd, name)
    try:
        os.mkdir(name, 0o700, dir_fd=root_fd)
    except FileExistsError:
        pass
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    if os.fstat(fd).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.fchmod(fd, 0o700)
    return fd


def _in_cache(path: Path) -> tuple[str, str] | None:
    """(part, file name) of a path `file` gave, else None (a debug copy, outside the cache)."""
    if path.parent.name in PARTS and path.parent.parent == root():
        return path.parent.name, path.name
    return None


def _remove_at(dir_fd: int, name: str) -> None:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def file(part_name: str, name: str) -> Path:
    """The file `name` of a part; `name` must be a plain file name (never a path out of the cache)."""
    if not SAFE_NAME.fullmatch(name) or name.startswith(".."):
        raise ValueError(f"{name!r} is not a file name minicomp writes")
    return part(part_name) / name


def read_text(path: Path) -> str | None:
    """The text of a regular file, or None when it is absent or is not one (a directory, a symlink,
    undecodable bytes): every caller treats None as a miss and writes the file again."""
    located = _in_cache(path)
    if located is not None:
        try:
            part_fd = _part_fd(located[0])
            try:
                fd = os.open(located[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=part_fd)
            finally:
                os.close(part_fd)
            with os.fdopen(fd, "rb") as f:
                return f.read().decode("utf-8") if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
        except (OSError, UnicodeDecodeError):
            return None
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def is_file(path: Path) -> bool:
    """Is there a regular file at `path` (a path `file` gave)?"""
    located = _in_cache(path)
    if located is None:
        return path.is_file()
    try:
        part_fd = _part_fd(located[0])
        try:
            return stat.S_ISREG(os.stat(located[1], dir_fd=part_fd, follow_symlinks=False).st_mode)
        finally:
            os.close(part_fd)
    except OSError:
        return False


def write_atomic(path: Path, text: str) -> None:
    """Write then rename: a reader sees the old file or the whole new one. Whatever stands at
    `path` and is not a regular file (a directory, a symlink) is removed first."""
    located = _in_cache(path)
    if located is not None:
        _write_in_part(*located, text)
        return
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


def _write_in_part(part_name: str, name: str, text: str) -> None:
    part_fd = _part_fd(part_name)
    try:
        try:
            if not stat.S_ISREG(os.stat(name, dir_fd=part_fd, follow_symlinks=False).st_mode):
                _remove_at(part_fd, name)
        except FileNotFoundError:
            pass
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=part_fd)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, name, src_dir_fd=part_fd, dst_dir_fd=part_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=part_fd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(part_fd)


# -- records: JSON with a checksum of their content ----------------------------------------


def _checksum(body: str) -> str:
    from minicomp import __version__

    return hashlib.sha256(f"minicomp {__version__} record {RECORD_FORMAT}\x00{body}".encode()).hexdigest()


def write_record(path: Path, record: dict) -> None:
    """Write `record` (JSON) with a checksum of its whole content (and of minicomp's version).
    Keys keep their order: a kernel record's signature lists the kernel's parameters in order."""
    body = json.dumps(record)
    write_atomic(path, json.dumps({"checksum": _checksum(body), "record": body}))


def read_record(path: Path) -> dict | None:
    """The record `write_record` wrote at `path`, or None when it is absent, is not one, or does
    not match its checksum (damaged, edited, or written by another version): a miss."""
    text = read_text(path)
    if text is None:
        return None
    try:
        outer = json.loads(text)
        body = outer["record"]
        if not isinstance(body, str) or outer["checksum"] != _checksum(body):
            raise ValueError("its content does not match its checksum")
        record = json.loads(body)
        if not isinstance(record, dict):
            raise ValueError("it is not a record")
    except (ValueError, KeyError, TypeError) as err:
        from minicomp import logs

        logs.cache.warning("%s is damaged or of another version (%s): a miss", path.name, err)
        return None
    return record


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
        sizes = [st.st_size for _, st in _own_files(name)]
        lines.append(f"  {name:8} {len(sizes):6} files {sum(sizes) / 1024:10.1f} KiB   {what}")
    lines.append(f"Triton's compiled kernels: {knobs.cache.dir} (TRITON_CACHE_DIR)")
    return "\n".join(lines)


def clear() -> int:
    """Delete minicomp's cached files (not Triton's); returns how many were removed. Only the
    files minicomp names (OWN) are removed: a user's file in its folders stays, and a symlink or
    file standing for a part is left as it is, never followed. (A module this process already
    loaded is written again the next time it is compiled: runtime.load.)"""
    removed = 0
    for name in PARTS:
        part_fd = _existing_part_fd(name)
        if part_fd is None:
            continue
        try:
            for file_name, _ in _own_files(name, part_fd):
                os.unlink(file_name, dir_fd=part_fd)
                removed += 1
        finally:
            os.close(part_fd)
    return removed


def _existing_part_fd(name: str) -> int | None:
    """A descriptor of the part `name` if it is a real directory (nothing is created or replaced)."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=_used()[1])
    except OSError:  # absent, or a file or symlink in its place
        return None


def _own_files(name: str, part_fd: int | None = None) -> list[tuple[str, os.stat_result]]:
    """(file name, stat) of the regular files of part `name` that minicomp names (OWN)."""
    fd = _existing_part_fd(name) if part_fd is None else part_fd
    if fd is None:
        return []
    try:
        with os.scandir(fd) as entries:
            return [
                (e.name, e.stat(follow_symlinks=False))
                for e in entries
                if OWN[name].fullmatch(e.name) and e.is_file(follow_symlinks=False)
            ]
    finally:
        if part_fd is None:
            os.close(fd)
