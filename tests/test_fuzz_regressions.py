"""Every input the fuzzer (ci/sanitize.sh fuzz) found a defect with, minimized, kept in tests/fuzz/regressions/:
each must now fail its load (or decode) with an error, in a normal load and in longhaul mode, never kill the
process. An input is a GGUF file, or a split model's shards in the fuzzer's container (tests/fuzz/seed_corpus.py)."""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "fuzz" / "regressions"
INPUTS = sorted(HERE.glob("*.bin")) if HERE.is_dir() else []  # .bin: *.gguf is gitignored

CHILD = r"""
import sys
from longhaul_cpp import LoadMode, Model
from longhaul_cpp._lib import LlamaError
path, mode = sys.argv[1], sys.argv[2]
kw = {"load_mode": LoadMode.LONGHAUL, "longhaul_cache": "auto"} if mode == "longhaul" else {}
try:
    with Model(path, **kw) as m, m.context(n_ctx=16, n_batch=16, n_ubatch=16, n_threads=1) as ctx:
        if m.n_vocab >= 2:
            ctx.decode([0, 1])
    print("loaded")
except (LlamaError, ValueError, OSError) as e:
    print(f"refused: {e}")
"""


def unpack(data: bytes, out: Path) -> Path:
    """The input's files in `out`; returns the first (the container of tests/fuzz/fuzz_container.h, or one file)."""
    if data[:8] == b"LHFZSPLT":
        (n,) = struct.unpack_from("<I", data, 8)
        sizes = struct.unpack_from(f"<{n}Q", data, 12)
        off = 12 + 8 * n
        paths = []
        for i, size in enumerate(sizes):
            paths.append(out / f"m-{i + 1:05d}-of-{n:05d}.gguf")
            paths[-1].write_bytes(data[off:off + size])
            off += size
        return paths[0]
    path = out / "m.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.skipif(not INPUTS, reason="no fuzzer finding kept yet")
@pytest.mark.parametrize("mode", ["normal", "longhaul"])
@pytest.mark.parametrize("name", [p.name for p in INPUTS])
def test_a_fuzzer_finding_fails_cleanly(tmp_path, name: str, mode: str) -> None:
    path = unpack((HERE / name).read_bytes(), tmp_path)
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name} ({mode}) killed the process ({r.returncode}): {r.stderr[-3000:]}"
    assert r.stdout.startswith(("refused:", "loaded")), r.stdout + r.stderr[-2000:]
