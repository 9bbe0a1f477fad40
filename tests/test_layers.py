"""The package's layers, stated once and checked: a module imports only from its own layer or below.

Read from the source (every `import`, including the ones inside functions), so
a lazy import cannot hide a cycle. The core (everything below `function`) never
imports the user-facing layers: api, nn, explain, demo, bench.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "minicomp"

# bottom first; a subpackage (ops, codegen, bench, templates) is one unit
LAYERS = [
    ["config", "logs", "dtypes", "workloads", "templates"],  # knows nothing of the compiler
    ["reads"],  # what a function reads from Python state
    [
        "cache",
        "indexing",
        "ir",
        "guards",
        "context",
        "interpreter_math",
        "compile_pool",
        "launch_configs",
    ],  # data structures, disk, guards
    [
        "layout",
        "ops",
        "launch",
        "runtime",
        "fallback",
        "reduction_space",
        "training_call",
    ],  # lowering, loading, launching
    [
        "fusion",
        "split_reductions",
        "fingerprint",
        "capture",
        "meta_trace",
        "specialize",
        "storages",
        "schedule",
    ],  # the plan, its order; tracing
    ["codegen"],  # plan -> source
    ["compiler", "persist"],  # the pipeline; entries on disk
    ["autograd", "dynamo", "function"],  # what a call compiles to
    ["nn"],
    ["api"],
    ["explain"],
    ["demo", "bench", "__main__", "__init__"],  # the user's commands
]
USER_FACING = {"api", "nn", "explain", "demo", "bench", "__main__", "__init__"}


def unit(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def imported_units(path: Path) -> set[str]:
    """The minicomp units `path` imports (minicomp itself counts as __init__)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "minicomp":  # from minicomp import x, y
            names = [f"minicomp.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "minicomp":
                continue
            if len(parts) == 1:
                found.add("__init__")
            elif (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").exists():
                found.add(parts[1])
    return found


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in PACKAGE.rglob("*.py"):
        me = unit(path)
        graph.add_node(me)
        for other in imported_units(path) - {me}:
            graph.add_edge(me, other)
    return graph


def test_every_module_has_a_layer():
    layered = {u for layer in LAYERS for u in layer}
    assert set(import_graph().nodes) <= layered, set(import_graph().nodes) - layered


def test_imports_point_down():
    level = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    upward = [(a, b) for a, b in import_graph().edges if level[b] > level[a]]
    assert upward == []


def test_no_import_cycles():
    assert list(nx.simple_cycles(import_graph())) == []


def test_the_core_never_imports_the_user_facing_layers():
    graph = import_graph()
    core = [u for u in graph.nodes if u not in USER_FACING]
    reached = {b for a in core for b in nx.descendants(graph, a)}
    assert reached & USER_FACING == set()
