"""Platform code that cannot run here is at least compiled: the Windows path of the expert reads."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

FORK = ROOT / "vendor" / "llama.cpp"
MINGW = shutil.which("x86_64-w64-mingw32-g++-posix") or shutil.which("x86_64-w64-mingw32-g++")


@pytest.mark.skipif(MINGW is None and not os.environ.get("CI"), reason="no mingw-w64 compiler (apt-get install g++-mingw-w64-x86-64-posix)")
def test_longhaul_compiles_for_windows() -> None:
    """ReadFile with an explicit offset, serialized per shard (src/llama-longhaul.cpp, _WIN32)."""
    assert MINGW, "CI installs g++-mingw-w64-x86-64-posix (ci/setup.sh)"
    src = FORK / "src" / "llama-longhaul.cpp"
    assert "ReadFile" in src.read_text()
    r = subprocess.run([MINGW, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                        "-I", str(FORK / "include"), "-I", str(FORK / "ggml" / "include"), "-I", str(FORK / "src"),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
