"""A kernel's records on disk: where its compiled binaries lie, and its measured configuration.

Binary records (`<cache>/kernels/`) point into Triton's cache: a process that
finds one loads the binary straight into a CompiledKernel, without Triton's JIT.
One record a binary: named by the kernel's text, launch configuration and what
Triton specializes on besides alignment (`specializations`); sizes are not part
of it, so a new batch size or sequence length reuses the binary.

Tuning records (`<cache>/tuning/`) are named by the kernel's text without its
name (its skeleton) and its size's class (size_classes.py: the next power of two): kernels of
one skeleton and size class share a choice, so a new length or batch size within the class
times nothing.
"""

from __future__ import annotations

import hashlib
import re
import threading
import types

import torch

from minicomp import logs
from minicomp.runtime import cache
from minicomp.runtime.launch_configs import valid_config
from minicomp.runtime.size_classes import bucket

# (a binary record's path, device index) -> (its kernel as loaded, the pointers it assumed aligned): a
# later module of this process with the same kernel text (a new sequence length's, issue #42) binds it
# without reading the record and loading the binary onto the GPU again
_RESTORED: dict[tuple[str, int], tuple[object, frozenset[int]]] = {}
_RESTORED_LOCK = threading.Lock()


def forget_restored() -> None:
    """Drop the binaries this process loaded (tests: the next first call reads its record)."""
    with _RESTORED_LOCK:
        _RESTORED.clear()


class Records:
    """The records of one kernel (its @triton.jit function, compiled for `device` with `options`)."""

    def __init__(self, kernel, name: str, device: torch.device, options: dict):
        self.kernel, self.name, self.device, self.options = kernel, name, device, options

    # -- binaries -----------------------------------------------------------------
    def binary_path(self, config: tuple[int, int], specializations: list[str]):
        """The record of the binary compiled at `config` for arguments of `specializations`."""
        block, warps = config
        return cache.file("kernels", f"{self.name}_{self.key(f'{block}x{warps}', specializations)}.json")

    def remember(self, compiled, path, aligned: set[int]) -> None:
        """Write the record of `compiled` (its pointers at `aligned` assumed 16-byte aligned)."""
        try:
            record = dict(
                hash=compiled.hash,
                metadata_group=compiled.metadata_group,
                aligned=sorted(aligned),
                signature=dict(compiled.src.signature),
                constants=[[list(k), v] for k, v in compiled.src.constants.items()],
            )
            cache.write_record(path, record)
        except (AttributeError, TypeError, ValueError, OSError) as err:  # not restorable: the JIT path stays
            logs.cache.info("%s: compiled kernel not remembered (%s)", self.name, err)
            return
        with _RESTORED_LOCK:
            _RESTORED[(str(path), self.device.index or 0)] = (compiled, frozenset(aligned))

    def restore(self, path, aligned: set[int]):
        """The compiled kernel of an earlier module of this process or of an earlier process, or None
        (then Triton's JIT compiles or loads it)."""
        with _RESTORED_LOCK:
            loaded = _RESTORED.get((str(path), self.device.index or 0))
        if loaded is not None and loaded[1] <= aligned:
            return loaded[0]
        try:
            record = cache.read_record(path)  # checksummed: a changed record is a miss
            if record is None:
                return None
            if not set(record["aligned"]) <= aligned:  # compiled for 16-byte aligned pointers these are not
                return None
            from triton.compiler.compiler import CompiledKernel

            _inside_triton_cache(record["metadata_group"])
            src = types.SimpleNamespace(
                fn=self.kernel, signature=record["signature"], constants={tuple(k): v for k, v in record["constants"]}
            )
            compiled = CompiledKernel(src, record["metadata_group"], record["hash"])
            compiled._init_handles()
        except Exception as err:  # noqa: BLE001 - a stale or damaged record: compile through the JIT
            logs.cache.info("%s: remembered kernel not usable (%s: %s)", self.name, type(err).__name__, err)
            return None
        logs.cache.info("%s: compiled kernel loaded from %s", self.name, path)
        with _RESTORED_LOCK:
            _RESTORED[(str(path), self.device.index or 0)] = (compiled, frozenset(record["aligned"]))
        return compiled

    # -- tuning -------------------------------------------------------------------
    def tuning_path(self, size: int):
        """The tuning record: named by the kernel's skeleton (its text without its name) and its
        size's class, so kernels that differ only in name, or in size within a class, share one
        measurement."""
        return cache.file("tuning", f"{self.key(bucket(size), skeleton=True)}.json")

    def remembered_config(self, size: int) -> tuple[int, int] | None:
        path = self.tuning_path(size)
        try:
            block, warps = valid_config((cache.read_record(path) or {})["config"])
        except (ValueError, KeyError, TypeError) as err:
            if cache.is_file(path):
                logs.cache.warning("tuning record %s is not usable (%s); measuring again", path.name, err)
            return None
        logs.cache.info("tuned launch config for %s from %s: %s x %s warps", self.name, path, block, warps)
        return block, warps

    def remember_config(self, size: int, best: tuple[int, int], times: dict[tuple[int, int], float]) -> None:
        record = {"config": list(best), "ms": {f"{b}x{w}": ms for (b, w), ms in times.items()}}
        cache.write_record(self.tuning_path(size), record)

    # -- names --------------------------------------------------------------------
    def key(self, *parts, skeleton: bool = False) -> str:
        """A hash of this kernel's text (without its name when `skeleton`), the GPU, Triton's
        version, its compile options and `parts`: names files on disk."""
        import triton

        source = self.text()
        source = re.sub(rf"\b{re.escape(self.name)}\b", "KERNEL", source) if skeleton else source
        text = "\n".join(
            [source, torch.cuda.get_device_name(self.device), triton.__version__, repr(sorted(self.options.items()))]
            + [repr(p) for p in parts]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def text(self) -> str:
        """The kernel's source and that of each @triton.jit function it calls (a combined launch's
        parts, a reduction's helpers): what its binary is made of, so what a record of it must be
        named by. (A combined launch's own text names its parts but does not hold them: two
        modules' combos of the same text may call different parts.)"""
        import triton

        source, names = self.kernel.src, getattr(getattr(self.kernel, "fn", None), "__globals__", {})
        called = sorted(set(re.findall(r"\b(\w+)\(", source)))
        parts = [
            names[n].src for n in called if isinstance(names.get(n), triton.JITFunction) and names[n] is not self.kernel
        ]
        return "\n".join([source, *parts])


def specializations(values, unspecialized: frozenset[int] = frozenset()) -> list[str]:
    """What Triton specializes each argument on besides alignment: a tensor's dtype (a tensor or,
    compiling ahead, its torch.dtype) and an integer's `int_class` (its type alone at the
    positions `unspecialized`: the kernel's `do_not_specialize`)."""
    return [_specialization(v, i in unspecialized) for i, v in enumerate(values)]


def _specialization(value, unspecialized: bool) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, int):
        return int_type(value) if unspecialized else int_class(value)
    return type(value).__name__


def int_type(value: int) -> str:
    """An integer's type alone (an argument Triton does not specialize on)."""
    return f"int {'i32' if -(2**31) <= value < 2**31 else 'i64'}"


def int_class(value: int) -> str:
    """What Triton's JIT specializes an integer argument on."""
    which = "one" if value == 1 else "multiple of 16" if value % 16 == 0 else "any"
    return f"int {which} {'i32' if -(2**31) <= value < 2**31 else 'i64'}"


def _inside_triton_cache(group: dict) -> None:
    """A kernel record points at files in Triton's cache, never anywhere else."""
    from pathlib import Path

    from triton import knobs

    root = Path(knobs.cache.dir).resolve()
    for path in group.values():
        if not Path(path).resolve().is_relative_to(root):
            raise ValueError(f"{path} lies outside Triton's cache {root}")
