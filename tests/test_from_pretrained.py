"""`Llama.from_pretrained` (llama/hub.py) against a Hugging Face hub cache made in tmp, offline (HF_HUB_OFFLINE=1):
a glob names one model, every shard of a split model is fetched and the model loads from the first, with the
keyword arguments going to `Llama` (longhaul too); the same tokens as `Llama(model_path=...)`; the errors for no
match, several models and a missing huggingface_hub; llama-cpp-python's README script runs unchanged but the import.

huggingface_hub reads its environment when imported, so each load runs in a fresh interpreter (SCRIPT)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from longhaul_cpp import Llama, SyntheticSpec

hub = pytest.importorskip("huggingface_hub") if not os.environ.get("CI") else __import__("huggingface_hub")

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")
SPLIT_SPEC = dataclasses.replace(SPEC, seed=7)  # other weights: a mix-up of the two models shows
LONGHAUL = {"load_mode": "longhaul", "longhaul_cache": "512KiB"}  # 10 of 16 slots per layer
SHARDS = [f"Q8_0/tiny-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]  # in a subfolder
README_REPO, README_FILE = "Qwen/Qwen2-0.5B-Instruct-GGUF", "qwen2-0_5b-instruct-q8_0.gguf"

# Loads a model (from_pretrained with the JSON keyword arguments, or Llama(model_path=...) with "model_path"),
# greedy-generates 8 tokens and prints the model's path, the files huggingface_hub was asked for and the tokens;
# or the exception's type and message.
SCRIPT = r"""
import json, sys
import huggingface_hub
from longhaul_cpp import Llama

fetched = []
real = huggingface_hub.hf_hub_download
def recording(*a, **kw):
    fetched.append(kw["filename"])
    return real(*a, **kw)
huggingface_hub.hf_hub_download = recording

kw = json.loads(sys.argv[1])
try:
    llm = Llama(**kw) if "model_path" in kw else Llama.from_pretrained(**kw)
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    sys.exit(0)
tokens = []
for t in llm.generate(llm.tokenize(b"The planets"), top_k=1, temp=0.0):
    tokens.append(t)
    if len(tokens) == 8:
        break
print(json.dumps({"model_path": llm.model_path, "fetched": fetched, "tokens": tokens}))
"""


def put_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A repository in the hub cache's layout: `models--owner--name/blobs/<sha256>`, `refs/main` (the commit) and
    `snapshots/<commit>/<path>` symlinks to the blobs. Returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repr(sorted(files)).encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snap


@pytest.fixture(scope="module")
def models(make_model) -> dict[str, Any]:
    return {"single": make_model(**dataclasses.asdict(SPEC))[0],
            "split": make_model(n_shards=3, **dataclasses.asdict(SPLIT_SPEC)),
            "other": make_model(**dataclasses.asdict(dataclasses.replace(SPEC, seed=3)))[0]}


@pytest.fixture(scope="module")
def cache(tmp_path_factory, models) -> Path:
    root = tmp_path_factory.mktemp("hub") / "hub"
    single, other = models["single"].read_bytes(), models["other"].read_bytes()
    put_repo(root, "tiny/single", {"tiny-Q8_0.gguf": single, "README.md": b"# tiny\n"})
    put_repo(root, "tiny/split", {**{n: p.read_bytes() for n, p in zip(SHARDS, models["split"])},
                                  "README.md": b"# split\n", "config/params.json": b"{}"})
    put_repo(root, "tiny/two", {"tiny-a-Q8_0.gguf": single, "tiny-b-Q8_0.gguf": other})
    put_repo(root, README_REPO, {README_FILE: single})
    # huggingface_hub itself reads the layout back as a cache of four repositories
    scanned = {r.repo_id: r for r in hub.scan_cache_dir(root).repos}
    assert sorted(scanned) == sorted(["tiny/single", "tiny/split", "tiny/two", README_REPO])
    assert {f.file_name for rev in scanned["tiny/split"].revisions for f in rev.files} >= {Path(s).name for s in SHARDS}
    return root


def load(cache: Path, **kw: Any) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "home")}
    kw = {"verbose": False, "n_ctx": 128, "n_threads": 2, **kw}
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(kw, default=str)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference(cache, models) -> dict[str, list[int]]:
    """The tokens of a plain `Llama(model_path=...)` load of each model."""
    out = {"single": load(cache, model_path=models["single"])["tokens"],
           "split": load(cache, model_path=models["split"][0])["tokens"]}
    assert out["single"] != out["split"]  # the two models tell apart
    return out


def test_single_file_model(cache, reference) -> None:
    got = load(cache, repo_id="tiny/single", filename="*Q8_0.gguf", additional_files=["README*"])
    assert got.get("error") is None, got
    assert got["tokens"] == reference["single"]
    assert got["fetched"] == ["tiny-Q8_0.gguf", "README.md"]
    assert Path(got["model_path"]).parent.parent.parent == cache / "models--tiny--single"


@pytest.mark.parametrize("glob", ["*-00001-of-00003.gguf", "*Q8_0*", "Q8_0/tiny-Q8_0-00002-of-00003.gguf"])
@pytest.mark.parametrize("mode", ["normal", "longhaul"])
def test_split_model_fetches_every_shard(cache, reference, glob, mode) -> None:
    """A glob matching the first shard, all shards or another shard: all three are fetched and the model loads from
    the first; normal and longhaul loads give the plain load's tokens."""
    got = load(cache, repo_id="tiny/split", filename=glob, additional_files=["config/*.json"],
               **(LONGHAUL if mode == "longhaul" else {}))
    assert got.get("error") is None, got
    assert got["fetched"] == SHARDS + ["config/params.json"]
    assert got["model_path"].endswith(SHARDS[0])
    assert got["tokens"] == reference["split"]


def test_no_match(cache) -> None:
    got = load(cache, repo_id="tiny/single", filename="*Q4_K_M*")
    assert got["error"] == "ValueError", got
    assert "no file in tiny/single matches '*Q4_K_M*'" in got["message"] and "tiny-Q8_0.gguf" in got["message"]


def test_several_models_match(cache) -> None:
    got = load(cache, repo_id="tiny/two", filename="*.gguf")
    assert got["error"] == "ValueError", got
    assert "2 different models" in got["message"]
    assert "tiny-a-Q8_0.gguf" in got["message"] and "tiny-b-Q8_0.gguf" in got["message"]
    assert "matches only one" in got["message"]
    got = load(cache, repo_id="tiny/split", filename="*", verbose=False)  # shards and other files: several too
    assert got["error"] == "ValueError" and "README.md" in got["message"], got


def test_repo_missing_from_the_offline_cache(cache) -> None:
    got = load(cache, repo_id="tiny/absent", filename="*.gguf")
    assert got["error"] == "FileNotFoundError" and "HF_HUB_OFFLINE" in got["message"], got


def test_without_huggingface_hub(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "longhaul-cpp\[hub\]"'):
        Llama.from_pretrained(repo_id="tiny/single", filename="*.gguf")


README_SCRIPT = '''
from longhaul_cpp import Llama

llm = Llama.from_pretrained(
    repo_id="Qwen/Qwen2-0.5B-Instruct-GGUF",
    filename="*q8_0.gguf",
    verbose=False
)
output = llm(
      "Q: Name the planets in the solar system? A: ", # Prompt
      max_tokens=32, # Generate up to 32 tokens, set to `None` to generate up to the end of the context window
      stop=["Q:", "\\n"], # Stop generating just before the model would generate a new question
      echo=True # Echo the prompt back in the output
) # Generate a completion, can also call create_completion
print(output)
import json; print(json.dumps(output))
'''


def test_llama_cpp_python_readme_script(cache, tmp_path) -> None:
    """llama-cpp-python's README: from_pretrained, then a completion with stop strings and echo."""
    script = tmp_path / "readme.py"
    script.write_text(README_SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "home")}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    output = json.loads(r.stdout.strip().splitlines()[-1])
    text = output["choices"][0]["text"]
    assert text.startswith("Q: Name the planets in the solar system? A: ") and "\n" not in text
    assert output["model"].endswith(README_FILE) and output["usage"]["completion_tokens"] > 0
