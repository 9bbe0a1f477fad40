"""Issue: never a wrong result, the cache part. What a second process serves, damage repaired,
and a cache that another user could write never runs their code."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp import runtime
from minicomp.__main__ import main as cli
from minicomp.runtime import cache

ROOT = Path(__file__).resolve().parents[2]  # the checkout: children import minicomp from it (GPU machine)


def run(script: str, cache_dir: Path, cwd: Path | None = None, **env) -> subprocess.CompletedProcess:
    environment = dict(
        os.environ,
        MINICOMP_CACHE_DIR=str(cache_dir),
        MINICOMP_LOGS="cache",
        PYTHONPATH=os.pathsep.join([str(cwd or ROOT), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


# -- a second process never serves stale code (items 1 and 5) -----------------------------

MODULE_SCRIPT = """
    import torch, minicomp, usermod
    x = torch.tensor([-1.0, 2.0])
    print(minicomp.jit(usermod.Act())(x).tolist())
"""


def test_edited_forward_is_not_served_from_the_cache(tmp_path):
    src = tmp_path / "usermod.py"
    src.write_text(
        "import torch\nclass Act(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    )
    first = run(MODULE_SCRIPT, tmp_path / "mc", cwd=tmp_path)
    assert first.stdout.split("\n")[0] == "[0.0, 2.0]"
    src.write_text(
        "import torch\nclass Act(torch.nn.Module):\n    def forward(self, x):\n        return torch.tanh(x) * 3\n"
    )
    second = run(MODULE_SCRIPT, tmp_path / "mc", cwd=tmp_path)
    expected = (torch.tanh(torch.tensor([-1.0, 2.0])) * 3).tolist()
    assert [round(v, 5) for v in json.loads(second.stdout)] == [round(v, 5) for v in expected]


ATTRIBUTE_SCRIPT = """
    import torch, minicomp, cfg
    def f(x):
        return cfg.act(x) * cfg.SCALE
    print(minicomp.jit(f)(torch.tensor([-1.0, 2.0])).tolist())
"""


@pytest.mark.parametrize(
    "edit, expected",
    [
        ("SCALE = 10.0\nact = torch.relu\n", [0.0, 20.0]),
        ("SCALE = 2.0\nact = torch.sigmoid\n", [2 * 0.2689414322376251, 2 * 0.8807970285415649]),
    ],
)
def test_edited_module_attribute_is_not_served_from_the_cache(tmp_path, edit, expected):
    (tmp_path / "cfg.py").write_text("import torch\nSCALE = 2.0\nact = torch.relu\n")
    assert json.loads(run(ATTRIBUTE_SCRIPT, tmp_path / "mc", cwd=tmp_path).stdout) == [0.0, 4.0]
    (tmp_path / "cfg.py").write_text("import torch\n" + edit)
    got = json.loads(run(ATTRIBUTE_SCRIPT, tmp_path / "mc", cwd=tmp_path).stdout)
    assert got == pytest.approx(expected, rel=1e-6)


HELPER_SCRIPT = """
    import torch, minicomp, minicomp.capture
    traces = []
    real = minicomp.capture.trace
    minicomp.capture.trace = lambda *a, **k: traces.append(1) or real(*a, **k)
    SCALE = 3.0
    def helper(x):
        return torch.relu(x) * SCALE
    class Act(torch.nn.Module):
        def forward(self, x):
            return helper(x) + 1
    x = torch.tensor([-1.0, 2.0])
    with torch.no_grad():
        print(minicomp.jit(Act())(x).tolist(), minicomp.jit(lambda t: helper(t) - 1)(x).tolist(), len(traces))
"""


def test_functions_and_modules_calling_a_helper_are_served_to_a_second_process(tmp_path):
    """The values a function or a module's forward reads (a helper function, a float) are keyed
    per call in the process, and stay out of the key on disk (the fingerprint covers them): a
    function's repr holds its address, which would make every process miss."""
    first = run(HELPER_SCRIPT, tmp_path / "mc", cwd=tmp_path).stdout.split("\n")[0]
    second = run(HELPER_SCRIPT, tmp_path / "mc", cwd=tmp_path).stdout.split("\n")[0]
    assert first == "[1.0, 7.0] [-1.0, 5.0] 2" and second == "[1.0, 7.0] [-1.0, 5.0] 0"


# -- damage is repaired, never a permanent fallback -----------------------------------

PROBE = """
    import torch, minicomp, minicomp.capture
    traces = []
    real = minicomp.capture.trace
    minicomp.capture.trace = lambda *a, **k: traces.append(1) or real(*a, **k)
    x = torch.randn(4, 8)
    out = minicomp.jit(lambda x: torch.relu(x) * 3, fallback="raise")(x)
    print(torch.equal(out, torch.relu(x) * 3), len(traces))
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A cache that one fresh process running PROBE filled (each damage test damages a copy)."""
    mc = tmp_path_factory.mktemp("probed") / "mc"
    assert run(PROBE, mc).stdout.split() == ["True", "1"]
    return mc


@pytest.mark.parametrize(
    "damage", ["bad_utf8", "directory_for_module", "modules_is_a_file", "entries_is_a_file", "modules_is_a_symlink"]
)
def test_cache_damage_is_repaired(tmp_path, damage, probed):
    mc = tmp_path / "mc"
    shutil.copytree(probed, mc, symlinks=True)
    module = next((mc / "modules").glob("*.py"))
    if damage == "bad_utf8":
        module.write_bytes(module.read_bytes() + b"\xff\xfe\n")
    elif damage == "directory_for_module":
        module.unlink()
        module.mkdir()
    elif damage in ("modules_is_a_file", "entries_is_a_file"):
        part = mc / damage.split("_")[0]
        shutil.rmtree(part)
        part.write_text("not a directory")
    else:
        elsewhere = tmp_path / "elsewhere"
        (mc / "modules").rename(elsewhere)
        (mc / "modules").symlink_to(elsewhere)
    assert run(PROBE, mc).stdout.split() == ["True", "1"]  # compiled again, no fallback
    assert run(PROBE, mc).stdout.split() == ["True", "0"]  # and the repaired cache serves the next process


def test_cache_clear_removes_every_part_and_info_lists_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    minicomp.jit(lambda x: x + 1)(torch.randn(3))
    (tmp_path / "mc" / "kernels").mkdir(exist_ok=True)
    (tmp_path / "mc" / "kernels" / f"mc_fused_add_0_{'0' * 20}.json").write_text("{}")
    assert cli(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert all(part in info for part in cache.PARTS)
    assert cli(["cache", "clear"]) == 0
    assert not [p for p in (tmp_path / "mc").rglob("*") if p.is_file()]


def test_cache_clear_never_follows_a_symlink(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    cache.root().joinpath("modules").symlink_to(precious)
    assert cli(["cache", "clear"]) == 0
    assert (precious / "keep.txt").read_text() == "mine"


def test_cache_clear_on_an_unwritable_dir_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    minicomp.jit(lambda x: x - 1)(torch.randn(3))

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("os.unlink", refuse)
    assert cli(["cache", "clear"]) == 1
    err = capsys.readouterr().err
    assert "Permission denied" in err and len(err.strip().splitlines()) == 1


# -- the cache executes code: nobody else's ---------------------------------------------


def test_a_cache_dir_others_may_write_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(shared))
    with pytest.warns(UserWarning, match="group or others may write it"):
        root = cache.root()
    assert root != shared and stat.S_IMODE(root.stat().st_mode) == 0o700
    torch.testing.assert_close(minicomp.jit(lambda x: x * 5)(torch.ones(2)), torch.full((2,), 5.0))
    assert not list(shared.iterdir())  # nothing written where others could change it


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_cache_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(theirs))
    with pytest.warns(UserWarning, match="belongs to user id 4242"):
        assert cache.root() != theirs


PLANTED = "open({marker!r}, 'w').write('ran')\n"


def test_an_entry_pointing_outside_the_cache_is_not_followed(tmp_path):
    mc = tmp_path / "mc"
    run(PROBE, mc)
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.py"
    evil.write_text(PLANTED.format(marker=str(marker)))
    entry = next((mc / "entries").glob("*.json"))
    record = cache.read_record(entry)
    record.update(module=str(evil), sha=runtime.source_hash(evil.read_text()))
    cache.write_record(entry, record)  # its checksum matches: the name is what is refused
    assert run(PROBE, mc).stdout.split() == ["True", "1"]
    assert not marker.exists()


def test_a_planted_pyc_is_never_imported(tmp_path):
    import importlib._bootstrap_external as bootstrap
    import importlib.util

    mc = tmp_path / "mc"
    run(PROBE, mc)
    module = next((mc / "modules").glob("*.py"))
    marker = tmp_path / "marker"
    code = compile(PLANTED.format(marker=str(marker)), str(module), "exec")
    st = module.stat()
    pyc = Path(importlib.util.cache_from_source(str(module)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bootstrap._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
    assert run(PROBE, mc).stdout.split() == ["True", "0"]
    assert not marker.exists()


def test_a_function_name_cannot_inject_code(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mc"))
    marker = tmp_path / "marker"

    def f(x):
        return x * 2

    f.__name__ = f.__qualname__ = f'x"""\nopen({str(marker)!r}, "w").write("ran")\n"""'
    torch.testing.assert_close(minicomp.jit(f)(torch.ones(3)), torch.full((3,), 2.0))
    assert not marker.exists()
    assert all(p.name.replace("_", "").replace(".", "").isalnum() for p in (tmp_path / "mc" / "modules").iterdir())


def test_file_names_from_entries_must_be_plain():
    for bad in ("/etc/passwd", "../x.py", "a/b.py", ""):
        with pytest.raises(ValueError):
            cache.file("modules", bad)


def test_no_warning_for_a_private_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "private"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.root() == tmp_path / "private"
