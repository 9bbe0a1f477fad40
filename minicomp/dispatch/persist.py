"""The persistent index: (function fingerprint, signature) -> generated module, across processes.

Generated modules are files named after the hash of their text (runtime/loader.py).
This index lets a second process go from a call's signature straight to the
module, without tracing: `<cache>/entries/<key>.json` holds the module's file
name and text hash, which arguments are tensors, which inputs the module
mutates, and how the outputs are put together (capture.Outputs).

Every read is checked: an entry that is unreadable, does not match the checksum
of its whole content (tensor_slots swapped by a bad disk, an edit, another
version: cache.read_record), names anything but a plain module file of the
cache, or whose module text no longer matches its hash (truncated, edited,
half-written by a crashed process) is a miss; the caller
compiles again and overwrites it. Writes are atomic (write then rename). The
directory itself is checked once per process (cache.py): one that others may
write is never used, so an entry cannot be planted.

Not persisted: signatures that need gradients (AOTAutograd builds them per
process), graphs that hold tensor constants (a closed-over tensor), functions
whose fingerprint is incomplete (fingerprint.py), and signatures keyed by an
object's identity (function.py).
"""

from __future__ import annotations

import hashlib

from minicomp import config, logs, runtime
from minicomp.capture import Outputs
from minicomp.runtime import cache


def key(fingerprint: str, signature) -> str:
    """The entry's name: the function, the call's signature and the settings that change what is
    generated for them (MINICOMP_MATMUL: a template or ATen's matmul; whether one row is a template)."""
    settings = f"matmul={config.get('matmul')} rows={config.get('matmul_rows')}>={config.get('matmul_row_min_k')}"
    return hashlib.sha256(f"{fingerprint}\x00{signature!r}\x00{settings}".encode()).hexdigest()[:32]


def _path(entry_key: str):
    return cache.file("entries", f"{entry_key}.json")


def store(entry_key: str, source: str, name: str, interpret: bool, tensor_slots, mutated, outputs: Outputs) -> None:
    encoded = outputs.dumps()
    if encoded is None:
        logs.cache.info("%s: returns values that cannot be stored: not cached across processes", name)
        return
    record = dict(
        function=name,
        module=runtime.module_name(source, name),
        sha=runtime.source_hash(source),
        interpret=interpret,
        tensor_slots=list(tensor_slots),
        mutated=list(mutated),
        outputs=encoded,
    )
    cache.write_record(_path(entry_key), record)


def load(entry_key: str):
    """(module, tensor_slots, mutated slots, Outputs) of a stored entry, or None if absent or damaged."""
    try:
        path = _path(entry_key)
        if not cache.is_file(path):
            logs.cache.info("entry %s: miss", entry_key)
            return None
        record = cache.read_record(path)
        if record is None:
            raise ValueError("it does not match its checksum")
        source = cache.read_text(cache.file("modules", record["module"]))
        if source is None or runtime.source_hash(source) != record["sha"]:
            raise ValueError("module text is missing or does not match its hash")
        outputs = Outputs.loads(record["outputs"])
        slots, mutated = [int(i) for i in record["tensor_slots"]], [int(i) for i in record["mutated"]]
        module = runtime.load(source, str(record["function"]), bool(record["interpret"]))
    except Exception as err:  # noqa: BLE001 - a damaged entry is a miss, never a crash
        logs.cache.warning("entry %s is damaged (%s: %s); compiling again", entry_key, type(err).__name__, err)
        return None
    logs.cache.info("entry %s: hit, module %s", entry_key, record["module"])
    return module, slots, mutated, outputs
