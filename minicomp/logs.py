"""Log channels, switched on by MINICOMP_LOGS in the spirit of TORCH_LOGS.

    MINICOMP_LOGS=graph,fusion python train.py     # the IR and the fusion plan of each compile
    MINICOMP_LOGS=all python train.py              # every channel

Channels (each a `logging` logger named minicomp.<channel>):
    graph        the captured ATen graph of each compiled signature, as IR; why make_fx traced it
    fusion       the fusion plan: kernels, extern calls, refused edges; launch tuning
    output_code  the generated module's source
    recompiles   a function compiled again, and why (which part of the signature changed)
    cache        module / tuning cache hits, misses and rebuilt entries
    cudagraphs   CUDA graphs recorded, dropped, and why a call or a graph runs without one

`set_logs("fusion,cache")` does the same from Python; `set_logs("")` turns them off.
Records go to stderr unless the application configured handlers of its own.
"""

from __future__ import annotations

import logging
import os

CHANNELS = ("graph", "fusion", "output_code", "recompiles", "cache", "cudagraphs")

graph = logging.getLogger("minicomp.graph")
fusion = logging.getLogger("minicomp.fusion")
output_code = logging.getLogger("minicomp.output_code")
recompiles = logging.getLogger("minicomp.recompiles")
cache = logging.getLogger("minicomp.cache")
cudagraphs = logging.getLogger("minicomp.cudagraphs")

_handler = logging.StreamHandler()
_handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))


def set_logs(spec: str) -> None:
    """Enable the comma-separated channels in `spec` ("all" for every one), disable the rest."""
    wanted = {c.strip() for c in spec.split(",") if c.strip()}
    if "all" in wanted:
        wanted = set(CHANNELS)
    unknown = wanted - set(CHANNELS)
    if unknown:
        raise ValueError(f"unknown MINICOMP_LOGS channel(s) {sorted(unknown)}; choose from {', '.join(CHANNELS)}, all")
    for name in CHANNELS:
        logger = logging.getLogger(f"minicomp.{name}")
        logger.setLevel(logging.INFO if name in wanted else logging.WARNING)
        if name in wanted and _handler not in logger.handlers:
            logger.addHandler(_handler)
        elif name not in wanted and _handler in logger.handlers:
            logger.removeHandler(_handler)


set_logs(os.environ.get("MINICOMP_LOGS", ""))
