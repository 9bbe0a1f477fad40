"""Issue #37, files: `minicomp cache clear` removes only what minicomp wrote, the checked cache
directory is the one written (a symlink re-pointed after the check redirects nothing), and an
entry whose content changed on disk is a miss, never served."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp.__main__ import main as cli
from minicomp.runtime import cache

ROOT = Path(__file__).resolve().parents[2]


# -- clear removes minicomp's files only ----------------------------------------------------


def test_cache_clear_keeps_the_users_files(tmp_path, monkeypatch, capsys):
    mc = tmp_path / "mc"
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(mc))
    minicomp.jit(lambda x: x * 4 - 1)(torch.randn(5))
    mine = {}
    for part in cache.PARTS:
        (mc / part).mkdir(exist_ok=True)
        for name in ("notes.txt", "keep.json", "helper.py", "ABC.json"):
            (mc / part / name).write_text(f"the user's {name}")
            mine[mc / part / name] = f"the user's {name}"
        (mc / part / "sub").mkdir()
        (mc / part / "sub" / "data.bin").write_text("x")
        mine[mc / part / "sub" / "data.bin"] = "x"
    (mc / "README").write_text("mine too")
    mine[mc / "README"] = "mine too"
    written = [p for p in mc.rglob("*") if p.is_file() and p not in mine]
    assert written  # minicomp's module and entry
    assert cli(["cache", "clear"]) == 0
    assert f"removed {len(written)} files" in capsys.readouterr().out
    assert not [p for p in written if p.exists()]
    for path, text in mine.items():
        assert path.read_text() == text


def test_cache_clear_keeps_a_users_file_named_like_a_temporary(tmp_path, monkeypatch, capsys):
    mc = tmp_path / "mc"
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(mc))
    minicomp.jit(lambda x: x + 7)(torch.randn(2))
    (mc / "entries" / ".hidden").write_text("mine")
    (mc / "modules" / "x.py").write_text("mine")
    assert cli(["cache", "clear"]) == 0
    assert (mc / "entries" / ".hidden").read_text() == "mine" and (mc / "modules" / "x.py").read_text() == "mine"
    assert not list((mc / "modules").glob("*_*.py"))


# -- the directory checked is the directory written ------------------------------------------


@pytest.mark.parametrize("what", ["root", "parent"])
def test_a_symlink_repointed_after_the_check_redirects_no_write(tmp_path, monkeypatch, what):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir(mode=0o700)
    theirs.mkdir()
    theirs.chmod(0o777)  # another user's directory that anyone may write (or read)
    link = tmp_path / "link"
    link.symlink_to(mine)
    configured = link if what == "root" else link / "mc"
    if what == "parent":
        (mine / "mc").mkdir(mode=0o700)
        (theirs / "mc").mkdir()
        (theirs / "mc").chmod(0o777)
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(configured))
    cache.root()  # checked: a private directory of this user's
    link.unlink()
    link.symlink_to(theirs)  # re-pointed after the check
    for dtype in (torch.float32, torch.int64):
        x = torch.arange(6).to(dtype)
        torch.testing.assert_close(minicomp.jit(lambda x: x * 3 + 2)(x), x * 3 + 2)
    assert not [p for p in theirs.rglob("*") if p.is_file()], list(theirs.rglob("*"))
    assert [p for p in mine.rglob("*") if p.is_file()]


# -- an entry is verified: one changed on disk is a miss --------------------------------------

SCRIPT = """
    import torch, minicomp, minicomp.capture
    traces = []
    real = minicomp.capture.trace
    minicomp.capture.trace = lambda *a, **k: traces.append(1) or real(*a, **k)
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.{dtype})
    b = torch.tensor([10.0, 20.0, 30.0], dtype=torch.{dtype})
    def f(a, b, scale=2):
        return a * scale - b
    out = minicomp.jit(f, fallback="raise")(a, b)
    print(out.tolist() == (a * 2 - b).tolist(), len(traces))
"""


def _run(tmp_path, dtype) -> list[str]:
    env = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(dtype=dtype))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _swap_slots(record):
    record["tensor_slots"] = record["tensor_slots"][::-1]


def _mutate_second(record):
    record["mutated"] = [1]


def _other_version(record):
    record["interpret"] = not record["interpret"]


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """dtype -> a folder whose cache "mc" one fresh process running SCRIPT filled (made once per
    dtype; each test damages a copy)."""
    made = {}

    def of(dtype: str) -> Path:
        if dtype not in made:
            made[dtype] = tmp_path_factory.mktemp(f"filled_{dtype}")
            assert _run(made[dtype], dtype) == ["True", "1"]
        return made[dtype]

    return of


@pytest.mark.parametrize("damage", [_swap_slots, _mutate_second, _other_version], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_an_entry_changed_on_disk_is_a_miss(tmp_path, damage, dtype, filled):
    shutil.copytree(filled(dtype) / "mc", tmp_path / "mc", symlinks=True)
    [entry] = (tmp_path / "mc" / "entries").glob("*.json")
    stored = json.loads(entry.read_text())
    wrapped = isinstance(stored.get("record"), str)  # the record's text under its checksum
    record = json.loads(stored["record"]) if wrapped else stored
    damage(record)
    if wrapped:  # changed, its checksum kept (a bad disk, an edit)
        stored["record"] = json.dumps(record, sort_keys=True)
    entry.write_text(json.dumps(stored if wrapped else record))
    assert _run(tmp_path, dtype) == ["True", "1"]  # recompiled: the damaged entry is not served
    assert _run(tmp_path, dtype) == ["True", "0"]  # and rewritten whole


def test_records_carry_a_checksum_verified_on_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    path = cache.file("tuning", "0123456789abcdef0123.json")
    cache.write_record(path, {"config": [1024, 4], "ms": {"1024x4": 0.1}})
    assert cache.read_record(path) == {"config": [1024, 4], "ms": {"1024x4": 0.1}}
    text = path.read_text().replace("1024, 4", "4096, 4")
    path.write_text(text)
    assert cache.read_record(path) is None
    path.write_text(json.dumps({"config": [1024, 4]}))  # no checksum: written by something else
    assert cache.read_record(path) is None
