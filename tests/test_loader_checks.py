"""The loader checks the series adds refuse only what the pin cannot run.

Patch 0015 refuses a header whose head sizes break an assert in the architecture's graph. Which architectures assert
what is read here from the pin's own source (pin_asserts.py: the live GGML_ASSERTs of src/models/*.cpp), so the
loader's sets cannot drift from upstream; and a header that breaks only a commented-out assert (MiniMax-M2's
published files rotate half of each head) loads and runs as upstream runs it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import ROOT
from longhaul_cpp import LlamaError, LoadMode, Model
from pin_asserts import _arch_names, graph_head_asserts
from test_archs import BIN, check_arch, wide_model
from test_llama_cpp_python import _llama_cpp_python

FORK = ROOT / "vendor" / "llama.cpp"
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def pin_src(tmp_path_factory) -> Path:
    """The pristine pin's src/ (tag `upstream` of the materialized fork)."""
    if not (FORK / ".git").exists():
        pytest.skip("vendor/llama.cpp is not materialized (the build does it)")
    out = tmp_path_factory.mktemp("pin")
    tar = subprocess.run(["git", "-C", str(FORK), "archive", "upstream", "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar.stdout, check=True)
    return out


def fork_set(name: str) -> set[str]:
    """The architecture names in one of the loader's sets (src/llama-model.cpp of the patched tree)."""
    src = (FORK / "src" / "llama-model.cpp").read_text()
    m = re.search(r"static const std::set<llm_arch> " + name + r" = \{(.*?)\};", src, re.S)
    assert m, f"{name} is not in the patched src/llama-model.cpp"
    names = _arch_names(FORK)
    return {names[e] for e in re.findall(r"LLM_ARCH_\w+", m.group(1))}


def test_head_size_sets_are_the_pins_live_asserts(pin_src) -> None:
    asserts = graph_head_asserts(pin_src)
    one_size = {a for a, s in asserts.items() if "k=v" in s}
    whole_rope = {a for a, s in asserts.items() if {"rot=k", "rot=v"} & s}
    # the reader finds what a reader of the source finds (so an empty or broken scan cannot pass)
    assert {"llama", "qwen3moe", "llama4", "dbrx", "olmoe"} <= whole_rope
    assert {"minimax-m2", "minimax-01", "nemotron"} <= one_size - whole_rope  # their rope asserts are commented out
    assert not {"deepseek2", "gpt-oss", "gemma3"} & one_size  # MLA, k != v heads, per-layer sizes: no such assert
    assert whole_rope <= one_size  # every graph that asserts the rope also asserts one head size
    assert fork_set("llm_arch_one_head_size") == one_size
    assert fork_set("llm_arch_whole_head_rope") == whole_rope


def test_scan_sees_only_live_asserts(tmp_path) -> None:
    """A commented-out assert does not count, an uncommented one does (the reader itself, on a made-up tree)."""
    from pin_asserts import strip_comments

    text = "GGML_ASSERT(a == b); // GGML_ASSERT(n_embd_head == n_rot);\n/* GGML_ASSERT(x == y); */ z"
    assert strip_comments(text).count("GGML_ASSERT") == 1


def _set_key(path: Path, key: str, value: int) -> None:
    r = gguf.GGUFReader(str(path), "r+")
    field = r.fields[key]
    field.parts[field.data[0]][0] = value
    del r


def _rope_dims(path: Path, arch: str) -> tuple[int, int]:
    r = gguf.GGUFReader(str(path))
    def get(k: str) -> int:
        f = r.fields[f"{arch}.{k}"]
        return int(f.parts[f.data[0]][0])
    return get("rope.dimension_count"), get("attention.key_length")


GREEDY = """
import importlib, json, sys
import numpy as np
lc = importlib.import_module(sys.argv[1])
llm = lc.Llama(sys.argv[2], n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, n_threads_batch=2, logits_all=True,
               verbose=False)
prompt = [int(t) for t in np.random.default_rng(0).integers(0, llm.n_vocab(), 24)]
llm.eval(prompt)
ids = []
for _ in range(8):
    ids.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.eval([ids[-1]])
print(json.dumps({"ids": ids, "logits": llm.scores[:llm.n_tokens].astype(float).round(6).tolist()}))
"""


def _greedy_run(python: str, module: str, path: Path) -> dict | None:
    """Greedy ids and every position's logits through `module`'s Llama; None when the model does not load (the
    library's refusal, not a crash)."""
    import json

    r = subprocess.run([python, "-c", GREEDY, module, str(path)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and ("Failed to load model" in r.stderr or "failed to load model" in r.stderr):
        return None
    assert r.returncode == 0, f"{module}: {r.stderr[-3000:]}"
    return json.loads(r.stdout)


def _greedy(python: str, module: str, path: Path) -> dict:
    out = _greedy_run(python, module, path)
    assert out is not None, f"{module} does not load {path}"
    return out


@pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")
@pytest.mark.parametrize("arch", ["minimax-m2", "minimax-01"])
def test_partial_rope_of_published_minimax_files_runs(arch, tmp_path) -> None:
    """MiniMax-M2's published files have key_length 128 and rope.dimension_count 64: upstream's graph does not
    assert a whole-head rope for it. Upstream's own fixture, rewritten to rotate half of each head, loads and gives
    llama-cpp-python's (the unpatched pin's) token ids and logits, and longhaul gives the normal load's bit for bit
    at every budget (test_archs.check_arch)."""
    path = wide_model(arch, tmp_path)
    n_rot, head = _rope_dims(path, arch)
    assert n_rot == head and head % 4 == 0
    _set_key(path, f"{arch}.rope.dimension_count", head // 2)
    assert _rope_dims(path, arch) == (head // 2, head)
    theirs = _greedy(_llama_cpp_python(), "llama_cpp", path)
    ours = _greedy(sys.executable, "longhaul_cpp", path)
    assert ours["ids"] == theirs["ids"]
    assert np.array_equal(np.array(ours["logits"]), np.array(theirs["logits"]))
    ran: list[str] = []
    failures = check_arch(arch, path, ran, [], {})
    assert not failures, "\n".join(failures)
    assert len(ran) == 6


@pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")
@pytest.mark.parametrize("arch, key, ratio, match", [
    ("qwen3moe", "rope.dimension_count", 2, r"invalid n_rot: \d+, expected \d+ \(this architecture's graph rotates"),
    ("minimax-m2", "attention.value_length", 2, r"attention.key_length = \d+ and .*value_length = \d+ differ"),
])
def test_a_header_that_breaks_a_live_assert_is_refused(arch, key, ratio, match, tmp_path) -> None:
    """Where the pin's graph does assert (qwen3moe: whole-head rope; MiniMax-M2: one head size for K and V), the
    loader refuses the header by name instead of aborting at the first graph."""
    path = wide_model(arch, tmp_path)
    r = gguf.GGUFReader(str(path))
    f = r.fields.get(f"{arch}.{key}")
    if f is None:
        pytest.skip(f"the fixture has no {key}")
    value = int(f.parts[f.data[0]][0])
    del r
    _set_key(path, f"{arch}.{key}", value // ratio)
    with pytest.raises(LlamaError, match=match):
        Model(path, load_mode=LoadMode.NONE)
