"""A process that compiles Triton kernels for the compile threads (compile_processes.py).

Triton's frontend (its AST walk to TTIR) is Python and holds the GIL, so compile
threads in one process take turns there and slow the thread that traces and
tunes. A worker process compiles side by side with the others. It is started by
this file's path, not as part of the package, and imports the standard library
and Triton only (about 0.2 s), never torch or minicomp.

A request names a generated module's file (the cache's `modules/`, loader.py), a
kernel in it, and the specialization Triton's JIT serialized for that kernel in
the main process (`JITFunction.preload`'s data: argument types, constants,
alignment, options). The worker runs the file's Triton imports and its
@triton.jit functions (its other statements import torch and minicomp; skipped),
at their own lines, so each function's source and cache key are the main
process's, then `preload`s the kernel: Triton compiles it for the request's
target into its cache. The main process's JIT then finds the binary there.
Nothing here touches a GPU: the active driver is a stand-in that names the
target.

Requests and replies are pickled dicts, each framed by its length, on stdin and
on a copy of stdout (what Triton prints goes to stderr); the first reply, before
any request, says the worker is ready. End of input: exit.
"""

from __future__ import annotations

import ast
import os
import pickle
import struct
import sys
import time

_HEADER = struct.Struct("<Q")


def write_frame(stream, message: dict) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream) -> dict | None:
    """The next message, or None at the end of the stream (a partial frame included)."""
    head = _read_exactly(stream, _HEADER.size)
    if head is None:
        return None
    body = _read_exactly(stream, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)  # noqa: S301 - our own process's pipe


def _read_exactly(stream, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class CompilingDriver:
    """Triton's active driver in a process that only compiles: device 0 of `target`, no GPU."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    @staticmethod
    def is_active() -> bool:
        return False


def kernels_of(path: str, module_name: str) -> dict:
    """The namespace of the module file at `path` holding its Triton imports and @triton.jit
    functions, each at its line in the file, with `__name__` `module_name` (the main process's)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    kept = ast.Module(body=[node for node in tree.body if _kept(node)], type_ignores=[])
    namespace = {"__name__": module_name, "__file__": path}
    exec(compile(kept, path, "exec"), namespace)  # noqa: S102 - minicomp's generated file, its Triton parts
    return namespace


def _kept(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return all(alias.name.split(".")[0] == "triton" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "triton"
    if isinstance(node, ast.FunctionDef):
        return any(_is_triton_jit(d) for d in node.decorator_list)
    return False


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit" and _name(target.value) == "triton"


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def compile_request(request: dict, modules: dict) -> dict:
    """Compile the kernel a request names into Triton's cache: the reply."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    start = time.perf_counter()
    try:
        _same_triton(*request["triton"])
        knobs.cache.dir = request["cache_dir"]
        knobs.runtime.interpret = False  # (an inherited TRITON_INTERPRET would make no binary)
        driver.set_active(CompilingDriver(GPUTarget(*request["target"])))
        key = (request["path"], request["module"])
        if key not in modules:
            modules[key] = kernels_of(*key)
        kernel = modules[key][request["kernel"]]
        compiled = kernel.preload(request["specialization"])
    except Exception as err:  # noqa: BLE001 - reported to the main process, which compiles it itself
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {"ok": True, "hash": compiled.hash, "seconds": time.perf_counter() - start}


def triton_fingerprint() -> tuple:
    """The installed Triton this process imported: its package file, version, and its compiled
    library's size, modification time and inode (a Triton rebuilt in place changes them)."""
    import sysconfig

    import triton

    root = os.path.dirname(os.path.realpath(triton.__file__))
    suffix = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    library = os.stat(os.path.join(root, "_C", f"libtriton.{suffix}"))
    return root, triton.__version__, library.st_size, library.st_mtime_ns, library.st_ino


def _same_triton(fingerprint: tuple, key: str) -> None:
    """Use the main process's hash of Triton's installation (its `triton_key`, which reads all
    400 MB of libtriton: a second or more of CPU in each worker), once this process's Triton
    is that installation."""
    import triton.runtime.cache

    if triton_fingerprint() != tuple(fingerprint):
        raise RuntimeError(f"this worker's Triton {triton_fingerprint()} is not the main process's {fingerprint}")
    triton.runtime.cache.triton_key = lambda: key  # what `get_cache_key` calls


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print cannot break a frame
    requests = sys.stdin.buffer
    os.nice(5)  # the main process's tracing and tuning first, where both want a core
    import triton.compiler  # noqa: F401 - imported before the worker says it is ready

    write_frame(replies, {"ready": True})
    modules: dict = {}
    while (request := read_frame(requests)) is not None:
        write_frame(replies, compile_request(request, modules))


if __name__ == "__main__":
    main()
