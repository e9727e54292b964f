"""The pin materializes, the series applies as commits on `upstream`, export round-trips."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run

TOOL = [sys.executable, str(ROOT / "vendor" / "longhaul_vendor.py")]
PIN = json.loads((ROOT / "vendor" / "pin.json").read_text())


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def vendor(*args: str, **kw) -> subprocess.CompletedProcess:
    return run([*TOOL, *args], text=True, **kw)


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fork") / "llama.cpp"
    r = vendor("materialize", "--fork", str(d), "--patches", str(ROOT / "patches"))
    assert r.returncode == 0, r.stderr
    return d


def test_materialize_commits_pin_then_series(fork: Path) -> None:
    assert (fork / "include" / "llama.h").is_file()
    assert git(fork, "rev-list", "--count", "upstream") == "1"
    first = git(fork, "log", "--format=%B", "-1", "upstream")
    assert PIN["upstream_commit"] in first and f"{PIN['package']}=={PIN['version']}" in first
    n_patches = len(list((ROOT / "patches").glob("*.patch")))
    assert int(git(fork, "rev-list", "--count", "upstream..HEAD")) == n_patches
    assert git(fork, "status", "--porcelain") == ""


def _structs(text: str) -> dict[str, int]:
    """lines of each struct defined at column 0 (from `struct NAME ... {` to `};`)"""
    out: dict[str, int] = {}
    name, start = "", 0
    for i, line in enumerate(text.splitlines()):
        if line.startswith("struct ") and line.rstrip().endswith("{"):
            name, start = line.split()[1], i
        elif line == "};" and name:
            out[name] = i - start + 1
            name = ""
    return out


def test_the_core_is_in_pieces_a_reader_holds(fork: Path) -> None:
    """Issue 57: each component of the longhaul core has a header of its own, none over ~300 lines, no struct over
    ~130 (a struct that grows past it holds more than one owner's state: split it, docs/longhaul.md)."""
    headers = sorted((fork / "src").glob("llama-longhaul*.h"))
    names = {h.name for h in headers}
    for part in ("layout", "graph", "errors", "hooks", "policy", "io", "memory", "split"):
        assert f"llama-longhaul-{part}.h" in names, names
    for h in headers:
        text = h.read_text()
        assert len(text.splitlines()) <= 300, f"{h.name}: {len(text.splitlines())} lines"
        for name, n in _structs(text).items():
            assert n <= 130, f"{h.name}: struct {name} has {n} lines"
    # upstream's files that only ask a longhaul model what it allows see the hooks, not the cache
    adapter = (fork / "src" / "llama-adapter.cpp").read_text()
    assert '#include "llama-longhaul-hooks.h"' in adapter and '#include "llama-longhaul.h"' not in adapter


def test_materialize_twice_is_a_no_op(fork: Path) -> None:
    head = git(fork, "rev-parse", "HEAD")
    r = vendor("materialize", "--fork", str(fork), "--patches", str(ROOT / "patches"))
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stderr
    assert git(fork, "rev-parse", "HEAD") == head


@pytest.mark.slow
def test_export_round_trip(fork: Path, tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    work = tmp_path / "work" / "llama.cpp"
    shutil.copytree(fork, work, symlinks=True)
    (work / "src" / "llama-longhaul-roundtrip.txt").write_text("a change made in the fork\n")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "test: a change in the fork")

    r = vendor("export", "--fork", str(work), "--patches", str(patches))
    assert r.returncode == 0, r.stderr
    files = sorted(patches.glob("*.patch"))
    assert len(files) == len(list((ROOT / "patches").glob("*.patch"))) + 1
    new = files[-1]
    assert new.name.endswith("-test-a-change-in-the-fork.patch")
    text = new.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")  # --zero-commit
    assert "Subject: [PATCH] test: a change in the fork" in text  # -N: no n/m numbering
    assert not text.rstrip().endswith(("--", "2.39.5"))  # --no-signature: no version trailer
    before = {p.name: p.read_bytes() for p in files}

    # exporting an unchanged fork again changes nothing
    r = vendor("export", "--fork", str(work), "--patches", str(patches))
    assert r.returncode == 0 and "0 file(s) changed" in r.stderr
    assert {p.name: p.read_bytes() for p in patches.glob("*.patch")} == before

    # the exported series materializes to the same tree
    again = tmp_path / "again" / "llama.cpp"
    r = vendor("materialize", "--fork", str(again), "--patches", str(patches))
    assert r.returncode == 0, r.stderr
    assert git(again, "rev-parse", "HEAD^{tree}") == git(work, "rev-parse", "HEAD^{tree}")


def test_fork_work_is_never_discarded_silently(fork: Path, tmp_path: Path) -> None:
    work = tmp_path / "llama.cpp"
    shutil.copytree(fork, work, symlinks=True)
    (work / "README.md").write_text("edited\n")
    r = vendor("materialize", "--fork", str(work), "--patches", str(ROOT / "patches"))
    assert r.returncode == 1
    assert "not in patches/" in r.stderr and "export" in r.stderr
    assert (work / "README.md").read_text() == "edited\n"


@pytest.mark.slow
def test_patch_that_does_not_apply_is_named(fork: Path, tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    (patches / "0999-broken.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: t <t@t>\nDate: Thu, 1 Oct 2026 00:00:00 +0000\nSubject: [PATCH] broken\n\n---\n"
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
        "@@ -1,1 +1,1 @@\n-this line is not in upstream's README\n+nor is this\n"
    )
    r = vendor("materialize", "--fork", str(tmp_path / "llama.cpp"), "--patches", str(patches))
    assert r.returncode == 1
    assert "0999-broken.patch does not apply" in r.stderr
    assert not (tmp_path / "llama.cpp").exists()  # nothing half-made is left behind


def test_checksum_is_verified(tmp_path: Path) -> None:
    fake = tmp_path / PIN["archive"]
    fake.write_bytes(b"not the pinned sdist")
    env = {"LONGHAUL_UPSTREAM_SOURCE": str(fake), "PATH": "/usr/bin:/bin"}
    r = vendor("materialize", "--fork", str(tmp_path / "llama.cpp"), env=env)
    assert r.returncode == 1
    assert "sha256" in r.stderr and PIN["sha256"] in r.stderr


def test_sdist_carries_the_pin_and_the_series_not_the_source(tmp_path: Path) -> None:
    """The sdist has what an offline build needs besides the pinned archive: the pin, the tool and
    every patch; never the generated vendor/llama.cpp."""
    import tarfile

    r = run([sys.executable, "-c", "import sys; from scikit_build_core.build import build_sdist; "
             "print(build_sdist(sys.argv[1]))", str(tmp_path)], text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    with tarfile.open(tmp_path / r.stdout.strip().splitlines()[-1]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {"vendor/pin.json", "vendor/longhaul_vendor.py", "CMakeLists.txt", "pyproject.toml"} <= names
    patches = {f"patches/{p.name}" for p in (ROOT / "patches").glob("*.patch")}
    assert patches and patches <= names
    assert not any(n.startswith("vendor/llama.cpp/") for n in names)


@pytest.mark.slow
def test_download_works_inside_an_isolated_build_environment(tmp_path: Path) -> None:
    """`pip install .` runs CMake, and so this tool, inside pip's isolated build environment, where
    PYTHONPATH points at the build overlay and the interpreter's own pip cannot be imported: the
    download must still find pip (it failed this way on a fresh machine). A fake `pip` module on
    PYTHONPATH stands in for the overlay; the pinned sdist is served from a local folder."""
    sys.path.insert(0, str(ROOT / "vendor"))
    import longhaul_vendor

    pin = longhaul_vendor.load_pin()
    source = longhaul_vendor.fetch(pin)  # the build already has it in the cache
    links = tmp_path / "links"
    links.mkdir()
    (links / source.name).symlink_to(source)
    overlay = tmp_path / "overlay" / "pip"
    overlay.mkdir(parents=True)
    (overlay / "__init__.py").write_text("raise ImportError('hidden by the isolated build environment')\n")
    (overlay / "__main__.py").write_text("raise ImportError('hidden by the isolated build environment')\n")
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(overlay.parent), "PYTHONNOUSERSITE": "1",
           "LONGHAUL_CACHE_DIR": str(cache), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    env.pop("LONGHAUL_UPSTREAM_SOURCE", None)
    r = run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import longhaul_vendor as v; "
             "print(v.fetch(v.load_pin()))", str(ROOT / "vendor")], text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert Path(r.stdout.strip()) == cache / "sdist" / pin["archive"]
    assert (cache / "sdist" / pin["archive"]).stat().st_size == source.stat().st_size


@pytest.mark.slow
@pytest.mark.long  # a whole build from the sdist
def test_sdist_installs_offline() -> None:
    """ci/sdist-offline.sh: the sdist from `python -m build --sdist` installs into a fresh venv with pip's index off,
    an empty package cache and LONGHAUL_UPSTREAM_SOURCE at the pinned archive (the build takes upstream from it,
    downloads nothing), and the installed package answers alike in a normal load and in longhaul mode."""
    r = run(["bash", str(ROOT / "ci" / "sdist-offline.sh")], text=True, timeout=1800,
            env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "installed offline in" in r.stdout and "answers alike in a normal load and in longhaul mode" in r.stdout
