"""The package as a user installs it: a wheel that ships the templates and every subpackage, and a
jitted call and the `minicomp` command working from outside the checkout."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # builds a wheel, installs it, compiles in a fresh process
def test_installed_wheel_ships_templates_and_compiles(tmp_path):
    """Build the wheel from a copy of the sources (a checkout's stale build/ cannot leak in), install
    it alone into a folder, and compile from there."""
    source = tmp_path / "source"
    for part in ("minicomp", "templates"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(source)],
        check=True,
    )
    wheel = next((tmp_path / "dist").glob("minicomp-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = sorted(p.name for p in (ROOT / "templates").glob("*.j2"))
    assert templates and {f"minicomp/templates/{t}" for t in templates} <= names
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "minicomp").rglob("__init__.py")}
    assert {f"{p}/__init__.py" for p in packages} <= names  # every subpackage (pyproject lists them by hand)
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True)
    script = (
        "import torch, minicomp; f = minicomp.jit(lambda x: torch.relu(x) + 1, fallback='raise'); "
        "x = torch.randn(5); assert torch.equal(f(x), torch.relu(x) + 1); "
        "print(minicomp.__file__)"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], env=env, check=True, capture_output=True, text=True, cwd=outside
    )
    assert str(site) in run("-c", script).stdout
    assert run("-m", "minicomp", "demo", "--help").stdout.startswith("usage: minicomp demo")
    assert list(outside.iterdir()) == []
