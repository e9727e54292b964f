"""Platform code that cannot run here is at least compiled: the Windows path of the expert reads, and
the whole patched tree with its tools for Windows (docs/portability.md)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

FORK = ROOT / "vendor" / "llama.cpp"
MINGW = shutil.which("x86_64-w64-mingw32-g++-posix") or shutil.which("x86_64-w64-mingw32-g++")


@pytest.mark.skipif(MINGW is None and not os.environ.get("CI"), reason="no mingw-w64 compiler (apt-get install g++-mingw-w64-x86-64-posix)")
def test_longhaul_compiles_for_windows() -> None:
    """ReadFile with an explicit offset, serialized per shard (src/llama-longhaul.cpp, _WIN32)."""
    assert MINGW, "CI installs g++-mingw-w64-x86-64-posix (ci/setup.sh)"
    src = FORK / "src" / "llama-longhaul.cpp"  # mingw defines _WIN32: the Windows read path is what compiles
    r = subprocess.run([MINGW, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                        "-I", str(FORK / "include"), "-I", str(FORK / "ggml" / "include"), "-I", str(FORK / "src"),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.skipif(MINGW is None and not os.environ.get("CI"), reason="no mingw-w64 compiler (apt-get install g++-mingw-w64-x86-64-posix)")
def test_patched_tree_and_tools_build_for_windows(tmp_path) -> None:
    """The whole patched tree cross-compiles and links for Windows x64 (ci/mingw-build.sh): ggml,
    libllama, the shipped tools and test-longhaul. Nothing runs (docs/portability.md)."""
    assert MINGW, "CI installs g++-mingw-w64-x86-64-posix (ci/setup.sh)"
    build = ROOT / "build" / "mingw"  # inside the checkout: ccache hits across clones (CCACHE_BASEDIR)
    r = subprocess.run(["bash", str(ROOT / "ci" / "mingw-build.sh"), str(build)], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    for exe in ("llama-cli", "llama-server", "llama-bench", "llama-completion", "test-longhaul"):
        assert (build / "bin" / f"{exe}.exe").is_file(), exe
    assert (build / "src" / "libllama.a").is_file()  # the tools link libllama statically here


WINE = shutil.which("wine") or shutil.which("wine64")


@pytest.mark.slow
@pytest.mark.skipif((MINGW is None or WINE is None) and not os.environ.get("CI"),
                    reason="needs mingw-w64 and wine (apt-get install g++-mingw-w64-x86-64-posix wine64)")
def test_windows_unit_tests_run_under_wine() -> None:
    """The Windows build of test-longhaul runs under wine: planner, waves, placement, the CPU
    mul_mat_id contract, and the I/O pool through ReadFile with offsets and per-shard locks."""
    assert MINGW and WINE, "CI installs g++-mingw-w64-x86-64-posix and wine64 (ci/setup.sh)"
    build = ROOT / "build" / "mingw"
    exe = build / "bin" / "test-longhaul.exe"
    if not exe.is_file():  # normally built by the test above
        subprocess.run(["bash", str(ROOT / "ci" / "mingw-build.sh"), str(build)], check=True, capture_output=True,
                       timeout=3600)
    gcc_dll = sorted(Path("/usr/lib/gcc/x86_64-w64-mingw32").glob("*-posix"))
    env = dict(os.environ, WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml=",
               WINEPATH=";".join([str(p) for p in gcc_dll] + ["/usr/x86_64-w64-mingw32/lib"]))
    r = subprocess.run([WINE, str(exe)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "all checks passed" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
