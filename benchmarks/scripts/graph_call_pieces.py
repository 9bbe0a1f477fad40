"""Where a graphed decode call's host time goes inside minicomp (issue #39), in one process.

    PYTHONPATH=. python benchmarks/scripts/graph_call_pieces.py MODEL

MODEL: gpt2 or llama (minicomp/bench/model_specs.py), one-token decode through
`torch.compile(mode="reduce-overhead", backend="minicomp")`. After 30 warm steps, 300 steps back to
back and 300 each synchronized, twice each: the step's wall µs and the µs a step spent in each piece
of runtime/graphs.py (each timed by a Python wrapper, which adds ~0.5 µs a piece): the graphed call,
its key, the address check of the inputs read in place (`at_their_addresses`), the record's replay
(the graph's replay, settling the outputs still held (`ready`), handing out the new ones), and any
input copies. Then what each
record holds: its dynamic inputs, buffers, outputs.
"""

import collections
import gc
import os
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402
from minicomp.runtime import graph_outputs, graphs  # noqa: E402

spent = collections.Counter()


def timed(owner, attr: str, label: str) -> None:
    inner = getattr(owner, attr)

    def piece(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, attr, piece)


def _timed_call(fn, label: str):
    def piece():
        start = time.perf_counter()
        try:
            return fn()
        finally:
            spent[label] += time.perf_counter() - start

    return piece


def main(name: str) -> None:
    timed(graphs.Graphed, "__call__", "0 graphed call")
    timed(graphs.Graphed, "_key", "1 key")
    timed(graphs, "at_their_addresses", "2 static check")
    timed(graphs.Record, "replay", "3 record.replay")
    timed(graph_outputs.OutputPlan, "ready", "4 ready (settling what callers hold)")
    launcher = graphs._launcher  # (a record binds torch's C++ replay at capture: time what it binds)
    graphs._launcher = lambda graph: _timed_call(launcher(graph), "5 graph.replay")
    timed(graph_outputs.OutputPlan, "hand_out", "6 hand_out")
    timed(graphs.Graphs, "saved_pending", "7 saved_pending")
    timed(torch.Tensor, "copy_", "8 copy_")
    timed(torch, "_foreach_copy_", "9 foreach_copy")
    run = model_row.real_step(name, "decode", "minicomp-graphs")
    for _ in range(30):
        run()
    torch.cuda.synchronize()
    for mode in ("b2b", "synced"):
        for _ in range(2):
            spent.clear()
            steps = 300
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                run()
                if mode == "synced":
                    torch.cuda.synchronize()
            wall = time.perf_counter() - start
            torch.cuda.synchronize()
            pieces = {k: round(v / steps * 1e6, 1) for k, v in sorted(spent.items())}
            print(name, mode, "step us", round(wall / steps * 1e6, 1), pieces)
    for graphed in [o for o in gc.get_objects() if _is_graphed(o)]:
        for record in graphed.records.values():
            print(
                "graphed",
                graphed.name,
                "dynamic",
                graphed.dynamic,
                "static n",
                len(graphed.static),
                "buffers",
                [(i, tuple(b.shape), b.dtype, m is not None) for i, b, m in record.buffers],
                "memories",
                len(record.plan.memories),
                "aliased",
                record.plan.aliased,
                "of_inputs",
                len(record.plan.of_inputs),
                "saved",
                len(record.saved),
            )


def _is_graphed(o) -> bool:
    try:
        return type(o) is graphs.Graphed
    except ReferenceError:  # (a weak proxy whose object is gone)
        return False


if __name__ == "__main__":
    main(sys.argv[1])
