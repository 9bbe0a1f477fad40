"""The package's layers, stated once and checked: a module imports only from its own layer or below.

Read from the source (every `import`, including the ones inside functions), so
a lazy import cannot hide a cycle. The compiler and its call path never import the
user-facing layers (tools, bench, the command line, the public API). `ls minicomp`
shows these layers: every folder is one, with its job in its `__init__`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "minicomp"

# The pipeline's stages, bottom first: one entry per folder of the package (its job is the
# first line of its __init__'s docstring), plus the few top-level modules.
LAYERS = [
    ["config", "logs", "tiles", "gc_pause"],  # settings, log channels, the untuned tile, the GC's pause: no compiler
    ["runtime"],  # what generated modules import: launching, loading, the cache directory
    ["guards"],  # when a compiled entry may serve a call
    ["ir"],  # the typed graph
    ["lowering"],  # ATen op -> Triton expressions of an index
    ["plan"],  # graph -> kernels, extern calls and their order
    ["codegen"],  # plan -> Triton source, from templates/
    ["capture"],  # Python function -> ATen graph
    ["pipeline"],  # the stages above, in one function
    ["dispatch"],  # what a call does: jit, modules, training, torch.compile, the disk
    ["tools"],  # explain, demo, example workloads
    ["bench", "__main__", "__init__"],  # minicomp against eager and Inductor; the commands; the public API
]
USER_FACING = {"tools", "bench", "__main__", "__init__"}


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


FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_every_folder_is_a_layer():
    layered = {u for layer in LAYERS for u in layer}
    assert set(FOLDERS) <= layered, set(FOLDERS) - layered


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_says_its_job(folder):
    """`pytest -v` on this file lists the stages: one test per folder, its job in its docstring."""
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
    assert doc and doc.split("\n")[0].strip(), f"{folder}/__init__.py has no one-line job"


def test_the_runtime_never_imports_the_compiler():
    """Generated modules import the runtime: it must not pull in the compiler's stages."""
    assert nx.descendants(import_graph(), "runtime") <= {"config", "logs", "tiles"}
