"""A header whose layer or expert counts are out of range fails the load with the key and what is wrong, in a normal
load and in longhaul mode, and never kills the process (patch 0009: upstream's GGML_ASSERTs on these counts aborted;
issue 46 found 35 of 320 mutated headers doing so). Each load runs in a child process, so that an abort fails
the test instead of the suite."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from longhaul_cpp import SyntheticSpec

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=8, n_expert_used=2, expert_type="q8_0")
BIG = 2**31 - 1

LOAD = r"""
import sys
from longhaul_cpp import LlamaError, LoadMode, Model
kw = {"load_mode": LoadMode.LONGHAUL, "longhaul_cache": 1.0} if sys.argv[2] == "longhaul" else {}
try:
    with Model(sys.argv[1], **kw):
        pass
except LlamaError as e:
    print(e)
    sys.exit(3)
print("loaded")
"""


def _mutant(src: Path, tmp_path: Path, key: str, value: int) -> Path:
    out = tmp_path / f"{key.replace('.', '_')}-{value}.gguf"
    shutil.copyfile(src, out)
    r = gguf.GGUFReader(out, "r+")
    field = r.fields[key]
    field.parts[field.data[0]][0] = value
    del r  # flushes the memory map
    return out


@pytest.mark.parametrize("key, value, message", [
    ("block_count", 0, "block_count = 0 is out of range"),
    ("block_count", BIG, f"block_count = {BIG} is out of range"),
    ("expert_count", 0, "expert_used_count = 2 is above qwen3moe.expert_count = 0"),
    ("expert_count", 1, "expert_used_count = 2 is above qwen3moe.expert_count = 1"),
    ("expert_count", BIG, f"expert_count = {BIG} is above the 1024 experts"),
    ("expert_used_count", 0, "expert_count = 8 but qwen3moe.expert_used_count is 0"),
    ("expert_used_count", BIG, f"expert_used_count = {BIG} is above qwen3moe.expert_count = 8"),
])
@pytest.mark.parametrize("mode", ["normal", "longhaul"])
def test_out_of_range_counts_fail_the_load(make_model, tmp_path, key: str, value: int, message: str, mode: str) -> None:
    src = make_model(**dataclasses.asdict(SPEC))[0]
    path = _mutant(src, tmp_path, f"qwen3moe.{key}", value)
    r = subprocess.run([sys.executable, "-c", LOAD, str(path), mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr[-2000:])  # an error, not an abort (-6)
    assert message in r.stdout and "the file's header is damaged" in r.stdout, r.stdout


def test_the_unmutated_file_loads(make_model, tmp_path) -> None:
    """The mutation itself leaves a valid file valid (the same value written back)."""
    src = make_model(**dataclasses.asdict(SPEC))[0]
    path = _mutant(src, tmp_path, "qwen3moe.expert_count", SPEC.n_expert)
    r = subprocess.run([sys.executable, "-c", LOAD, str(path), "longhaul"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "loaded" in r.stdout, (r.stdout, r.stderr[-2000:])
