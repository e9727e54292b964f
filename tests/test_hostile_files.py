"""Files that lie, in a normal load and in longhaul mode, each loaded in a child process (an abort fails the test,
not the suite): a header whose layer or expert counts are out of range fails the load with the key and what is wrong
(patch 0010: upstream's GGML_ASSERTs on these counts aborted; issue 46 found 35 of 320 mutated headers doing so),
and the shards of a split model given in the wrong order, twice, from a split of another count or of another
shape, or cut short fail the load naming the file or the tensor; a shard cut short under a running server fails the
requests that read past its end, and the server keeps serving."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import urllib.request
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
    with Model(sys.argv[1], **kw) as m, m.context(n_ctx=64, n_threads=2) as ctx:
        ctx.decode([1, 72, 105])
        top = int(ctx.logits().argmax())
except LlamaError as e:
    print(e)
    sys.exit(3)
print("loaded", top)
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


@pytest.mark.parametrize("mode", ["normal", "longhaul"])
def test_an_unknown_gating_function_fails_the_load(make_model, tmp_path, mode: str) -> None:
    """expert_gating_func outside the enum (the fuzzer's: 2^31-1) reached the MoE graph as an enum it cannot hold
    (undefined behaviour, UBSan in ci/sanitize.sh); it now fails the load like the counts above."""
    spec = dataclasses.replace(SPEC, arch="laguna", n_layer=3)
    path = _mutant(make_model(**dataclasses.asdict(spec))[0], tmp_path, "laguna.expert_gating_func", BIG)
    r = subprocess.run([sys.executable, "-c", LOAD, str(path), mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr[-2000:])
    assert f"laguna.expert_gating_func = {BIG} is no gating function" in r.stdout, r.stdout


@pytest.mark.parametrize("mode", ["normal", "longhaul"])
def test_a_file_type_out_of_range_is_ignored(make_model, tmp_path, mode: str) -> None:
    """general.file_type is informational, but a value outside enum llama_ftype (the fuzzer's: 7679) was stored in
    it (undefined behaviour, UBSan in ci/sanitize.sh): now ignored with a warning, and the model answers as before."""
    src = make_model(**dataclasses.asdict(SPEC))[0]
    tops = []
    logged = "import logging\nlogging.basicConfig(level=logging.WARNING)\n" + LOAD  # the library's warnings
    for path in (src, _mutant(src, tmp_path, "general.file_type", 7679)):
        r = subprocess.run([sys.executable, "-c", logged, str(path), mode], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "loaded" in r.stdout, (r.stdout, r.stderr[-2000:])
        tops.append(r.stdout.split()[-1])
    assert "general.file_type = 7679 is not a file type; ignored" in r.stderr, r.stderr[-3000:]
    assert tops[0] == tops[1]


def test_the_unmutated_file_loads(make_model, tmp_path) -> None:
    """The mutation itself leaves a valid file valid (the same value written back)."""
    src = make_model(**dataclasses.asdict(SPEC))[0]
    path = _mutant(src, tmp_path, "qwen3moe.expert_count", SPEC.n_expert)
    r = subprocess.run([sys.executable, "-c", LOAD, str(path), "longhaul"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "loaded" in r.stdout, (r.stdout, r.stderr[-2000:])


SHARDS = 3


@pytest.fixture(scope="module")
def splits(make_model):
    """The split model, the same with other weights, with another width, and in two shards."""
    base = dataclasses.asdict(SPEC)
    return (make_model(n_shards=SHARDS, **base), make_model(n_shards=SHARDS, **{**base, "seed": 7}),
            make_model(n_shards=SHARDS, **{**base, "n_embd": 128}), make_model(n_shards=2, **base))


@pytest.mark.parametrize("case, message", [
    ("swapped", "invalid split file idx: 2"),
    ("twice", "invalid split file idx: 0"),
    ("other count", "is duplicated"),
    ("other shape", "has wrong shape"),
    ("truncated", "is not within the file bounds"),
])
@pytest.mark.parametrize("mode", ["normal", "longhaul"])
def test_split_files_that_lie_fail_the_load(splits, tmp_path, case: str, message: str, mode: str) -> None:
    own, _, wide, two = splits
    for p in own:
        shutil.copyfile(p, tmp_path / p.name)
    second, third = tmp_path / own[1].name, tmp_path / own[2].name
    if case == "swapped":
        shutil.copyfile(own[2], second)
        shutil.copyfile(own[1], third)
    elif case == "twice":
        shutil.copyfile(own[0], second)
    elif case == "other count":
        shutil.copyfile(two[1], second)
    elif case == "other shape":
        shutil.copyfile(wide[1], second)
    else:
        with open(third, "r+b") as f:
            f.truncate(own[2].stat().st_size // 2)
    r = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / own[0].name), mode], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 3 and message in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_shard_of_a_model_with_the_same_inventory_loads_as_in_a_normal_load(splits, tmp_path) -> None:
    """Not detectable: a shard of another model with the same tensor names, shapes and types (GGUF shards carry no
    model identity). Longhaul does what the normal load does with it: the same tokens."""
    own, other = splits[0], splits[1]
    for p in own:
        shutil.copyfile(p, tmp_path / p.name)
    shutil.copyfile(other[1], tmp_path / own[1].name)
    outs = [subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / own[0].name), mode], capture_output=True,
                           text=True, timeout=120) for mode in ("normal", "longhaul")]
    assert all(o.returncode == 0 for o in outs), [o.stderr[-1500:] for o in outs]
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.startswith("loaded"), [o.stdout for o in outs]


def test_shards_changed_while_a_server_runs(splits, tmp_path) -> None:
    """llama-server in longhaul mode at one token's experts (every prompt reads) while its shards change: a shard cut
    short fails the request that reads past its end, naming the file and offset, and the server keeps serving (the
    next request that needs nothing from there, and every one after the shard is back, succeeds with the answer it
    gave before); a shard grown at its end changes nothing; a shard replaced by a rename is not seen (the server
    reads the file it opened)."""
    from longhaul_cpp.soak.clients import complete
    from longhaul_cpp.soak.run import SoakConfig, llama_server

    own = splits[0]
    for p in own:
        shutil.copyfile(p, tmp_path / p.name)
    first, third = tmp_path / own[0].name, tmp_path / own[2].name
    cfg = SoakConfig(model=first, budget="", max_prompt=256, parallel=1)
    budget = f"{SPEC.budget_for(SPEC.n_expert_used)}B"
    prompt = "The shards of a split model change under a running server, " * 3

    def ask() -> tuple[str, str, str]:
        status, content, msg, _ = complete(base, prompt, n_predict=8, stream=False)
        return status, content, msg

    with llama_server(cfg, "--longhaul", "--longhaul-cache", budget) as (base, proc):
        status, want, msg = ask()
        assert status == "ok", msg
        data = third.read_bytes()
        with open(third, "r+b") as f:  # cut short in place: the open descriptor sees it
            f.truncate(len(data) // 3)
        status, _, msg = ask()
        assert status == "fault" and third.name in msg and "offset" in msg, (status, msg)
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200
        third.write_bytes(data)  # back: the same answer
        assert ask() == ("ok", want, "")
        with open(third, "ab") as f:  # grown: the tensors are where they were
            f.write(b"\0" * 65536)
        assert ask() == ("ok", want, "")
        other = tmp_path / "other.gguf"
        shutil.copyfile(splits[1][2], other)
        other.replace(third)  # a new file under the name: the server keeps reading the one it opened
        assert ask() == ("ok", want, "")
        assert proc.poll() is None
