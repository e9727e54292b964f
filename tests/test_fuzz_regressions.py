"""Every input the fuzzer (ci/sanitize.sh fuzz) found a defect with, minimized, kept in tests/fuzz/regressions/:
each must now give its verdict (EXPECTED: a refusal naming the check that catches it, or a load where the value is
harmless), in a normal load and in longhaul mode, never kill the process. An input is a GGUF file, or a split model's shards in the fuzzer's container (tests/fuzz/seed_corpus.py)."""
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


# each input's verdict, in both modes: "loaded", or the words its refusal must carry (the check that refuses it)
EXPECTED = {
    "architecture-not-a-string.bin": "key general.architecture has wrong type u32 but expected type str",
    "attn-sinks-f16.bin": "tensor 'blk.0.attn_sinks.weight' is f16",
    "expert-count-0.bin": "GLM4_MOE needs experts",
    "exps-bias-f16.bin": "tensor 'blk.1.ffn_down_exps.bias' is f16",
    "file-type-7679.bin": "loaded",  # an unknown general.file_type is only a label: ignored (patch 0011)
    "kv-type-cut.bin": "failed to read key-value pairs",
    "llama4-rope-not-head.bin": "invalid n_rot: 167772176, expected 16",
    "mla-head-count-kv.bin": "attn_kv_a_mqa gives 40 values per token",
    "mla-rope-above-head.bin": "the K head size (16) is not above the rope dimension count (40)",
    "norm-f16.bin": "failed to read tensor data",
    "rope-sections-too-wide.bin": "rope.dimension_sections = [4, 4, 42244, 4] do not fit",
    "tensor-type-64.bin": "failed to read tensor info",
    "value-length-1.bin": "attn_v gives 32 values per token",
    "vocab-token-twice.bin": "a token is listed twice",
    "weight-type-i32.bin": "failed to find a compatible buffer type for tensor blk.0.attn_q.weight",
}


def test_every_input_has_its_verdict() -> None:
    assert sorted(EXPECTED) == [p.name for p in INPUTS]


@pytest.mark.skipif(not INPUTS, reason="no fuzzer finding kept yet")
@pytest.mark.parametrize("mode", ["normal", "longhaul"])
@pytest.mark.parametrize("name", [p.name for p in INPUTS])
def test_a_fuzzer_finding_fails_cleanly(tmp_path, name: str, mode: str) -> None:
    path = unpack((HERE / name).read_bytes(), tmp_path)
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name} ({mode}) killed the process ({r.returncode}): {r.stderr[-3000:]}"
    want = EXPECTED[name]
    if want == "loaded":
        assert r.stdout.startswith("loaded"), r.stdout + r.stderr[-2000:]
    else:
        assert r.stdout.startswith("refused:") and want in r.stdout, f"expected a refusal naming {want!r}: {r.stdout}"
        # auto's first dry run is at every expert cached, and says so (not as a budget of 2^63 bytes)
        assert "the dry run" not in r.stdout or "the dry run of" in r.stdout and "with every expert cached" in r.stdout
