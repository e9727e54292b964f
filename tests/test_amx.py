"""Upstream's AMX tile configuration (series patch 0035): ggml_tile_config_init() must hand _tile_loadconfig() the
rows and column widths it writes. GCC dropped those stores (it does not see the intrinsic read the struct), every
tile stayed unconfigured, and native builds crashed at the first prompt on CPUs with AMX (docs/decisions.md).

The function and its struct are taken from the patched tree as they are, compiled with GCC's optimizer and AMX on,
and, where the CPU has AMX, run: the configuration the CPU holds afterwards is read back with _tile_storeconfig.
Elsewhere the program is only compiled (the suite's builds leave AMX out: LONGHAUL_NO_AMX)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

MMQ = ROOT / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu" / "amx" / "mmq.cpp"
CXX = shutil.which("g++")

MAIN = r"""
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <sys/syscall.h>

int main() {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        std::printf("no-permission\n");
        return 0;
    }
    ggml_tile_config_init();
    alignas(64) tile_config_t got;
    std::memset(&got, 0xff, sizeof(got));
    _tile_storeconfig(&got);
    std::printf("palette %d rows", got.palette_id);
    for (int i = 0; i < 8; ++i) std::printf(" %d", got.rows[i]);
    std::printf(" colsb");
    for (int i = 0; i < 8; ++i) std::printf(" %d", got.colsb[i]);
    std::printf("\n");
    _tile_release();
    return 0;
}
"""


def _cpu_has_amx() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(re.search(rf"\b{f}\b", flags) for f in ("amx_tile", "amx_int8"))


def _extract(src: str, start: str) -> str:
    """The declaration that begins with `start`, through its closing brace at column 0."""
    i = src.index(start)
    j = src.index("\n}", i)
    return src[i:j + 2] + (";" if start.startswith("struct") else "") + "\n"


@pytest.mark.skipif(CXX is None, reason="no g++")
def test_tile_configuration_reaches_the_cpu(tmp_path) -> None:
    src = MMQ.read_text()
    prog = tmp_path / "tilecfg.cpp"
    prog.write_text("#include <immintrin.h>\n#include <cstdint>\n" + _extract(src, "struct tile_config_t")
                    + _extract(src, "inline void ggml_tile_config_init(void)") + MAIN)
    exe = tmp_path / "tilecfg"
    r = subprocess.run([CXX, "-std=c++17", "-O3", "-mamx-tile", "-mamx-int8", "-mavx512f", str(prog), "-o", str(exe)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    if not _cpu_has_amx():
        pytest.skip("compiled only: this CPU has no AMX (amx_tile, amx_int8) to run it")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    if r.stdout.startswith("no-permission"):
        pytest.skip("the kernel refused AMX tile data to this process")
    # the configuration upstream writes: tiles 0-1 8 x 64 B, 2-3 16 x 32 B, 4-7 16 x 64 B
    assert r.stdout.split() == ["palette", "1", "rows", "8", "8", "16", "16", "16", "16", "16", "16",
                                "colsb", "64", "64", "32", "32", "64", "64", "64", "64"], r.stdout
