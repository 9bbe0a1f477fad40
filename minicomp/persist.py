"""The persistent index: (function fingerprint, signature) -> generated module, across processes.

Generated modules are files named after the hash of their text (runtime.py).
This index lets a second process go from a call's signature straight to the
module, without tracing: `<cache>/entries/<key>.json` holds the module's file
name and text hash, which arguments are tensors, and the output structure.

Every read is checked: an entry that is unreadable, names a missing module,
or whose module text no longer matches its hash (truncated, edited,
half-written by a crashed process) is a miss; the caller compiles again and
overwrites it. Writes are atomic (write then rename).

Not persisted: signatures that need gradients (AOTAutograd builds them per
process) and graphs that hold tensor constants (a closed-over tensor).
"""
from __future__ import annotations

import hashlib
import json

from torch.utils import _pytree as pytree

from minicomp import logs, runtime


def key(fingerprint: str, signature) -> str:
    return hashlib.sha256(f"{fingerprint}\x00{signature!r}".encode()).hexdigest()[:32]


def _path(entry_key: str):
    return runtime.cache_dir() / "entries" / f"{entry_key}.json"


def store(entry_key: str, source: str, name: str, interpret: bool, tensor_slots, out_spec) -> None:
    record = dict(function=name, module=runtime.module_path(source, name).name, sha=runtime.source_hash(source),
                  interpret=interpret, tensor_slots=list(tensor_slots), out_spec=pytree.treespec_dumps(out_spec))
    runtime.write_atomic(_path(entry_key), json.dumps(record))


def load(entry_key: str):
    """(module, tensor_slots, out_spec) of a stored entry, or None if absent or damaged."""
    path = _path(entry_key)
    try:
        record = json.loads(path.read_text())
        source = (runtime.cache_dir() / "modules" / record["module"]).read_text()
        if runtime.source_hash(source) != record["sha"]:
            raise ValueError("module text does not match its hash")
        out_spec = pytree.treespec_loads(record["out_spec"])
        module = runtime.load(source, record["function"], record["interpret"])
    except FileNotFoundError:
        logs.cache.info("entry %s: miss", entry_key)
        return None
    except Exception as err:  # noqa: BLE001 - a damaged entry is a miss, never a crash
        logs.cache.warning("entry %s is damaged (%s: %s); compiling again", entry_key, type(err).__name__, err)
        return None
    logs.cache.info("entry %s: hit, module %s", entry_key, record["module"])
    return module, record["tensor_slots"], out_spec
