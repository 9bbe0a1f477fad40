"""The user and contributor docs point at things that exist: every relative link, and every path
of the repository they name in backticks (README.md, docs/*.md)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"`((?:minicomp|tests|benchmarks|templates|docs|examples)/[\w./*-]*)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_named_paths_exist(doc):
    text = doc.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text.replace("[grid](...)", "")):
        if not target.startswith(("http://", "https://")) and not (doc.parent / target).exists():
            missing.append(target)
    for path in PATH.findall(text):
        path = path.rstrip(".")
        if "*" in path:
            continue  # a pattern (`benchmarks/gpu_*.sh`, in git history)
        if not (ROOT / path).exists() and not (ROOT / "minicomp" / path).exists():
            missing.append(path)
    assert not missing, f"{doc.name} names what does not exist: {sorted(set(missing))}"


def test_the_readme_stays_short_and_shows_one_plot():
    text = (ROOT / "README.md").read_text()
    assert len(text) < 20_000
    assert len(re.findall(r"!\[[^\]]*\]\([^)]+\.png\)", text)) == 1
    assert '-k "cuda' not in text  # markers, not copied -k strings
