"""`longhaul_cpp.Llama` as a drop-in for llama-cpp-python 0.3.36's `Llama`, side by side with the real package
(installed by ci/test.sh from the registry): one script (lcp_contract.py) run through `llama_cpp` and through
`longhaul_cpp` (normal load, and longhaul at a budget below all experts) must print the same answers; the
signatures match; a chat's second turn reuses the history the context holds; what longhaul cannot honour is
refused by name."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from longhaul_cpp import Llama, SyntheticSpec
from longhaul_cpp.modelinfo import inspect_model

HERE = Path(__file__).parent
SPEC = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")
LONGHAUL = {"load_mode": "longhaul", "longhaul_cache": "512KiB"}  # 10 of 16 slots per layer


def _llama_cpp_python() -> str:
    """An interpreter that imports llama-cpp-python 0.3.36: this one (ci/test.sh installs it into the test
    venv) or $LONGHAUL_LLAMA_CPP_PYTHON. Missing: a failure under CI, a skip elsewhere."""
    for py in filter(None, [os.environ.get("LONGHAUL_LLAMA_CPP_PYTHON"), sys.executable]):
        r = subprocess.run([py, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout.strip() == "0.3.36":
            return py
    if os.environ.get("CI"):
        pytest.fail("llama-cpp-python 0.3.36 is not installed in the test environment (ci/test.sh installs it)")
    pytest.skip("llama-cpp-python 0.3.36 is not installed: pip install llama-cpp-python==0.3.36")


@pytest.fixture(scope="module")
def model(make_model) -> Path:
    return make_model(**dataclasses.asdict(SPEC))[0]


def _contract(python: str, module: str, model: Path, extra: dict[str, Any] | None = None,
              sections: str | None = None) -> Any:
    env = dict(os.environ)
    if module == "llama_cpp":  # the real package, never this package's libraries
        env.pop("LONGHAUL_CPP_LIB_DIR", None)
    cmd = [python, str(HERE / "lcp_contract.py"), module, str(model), json.dumps(extra or {})]
    r = subprocess.run(cmd + ([sections] if sections else []), capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, f"{module} {extra}: {r.stderr[-3000:]}"
    return json.loads(r.stdout)


def _same(a: Any, b: Any, path: str = "") -> list[str]:
    """Where a and b differ: floats within 1e-4, everything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-4 * max(1, abs(a))
        return [] if ok else [f"{path}: {a!r} != {b!r}"]
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _same(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}: {a!r:.300} != {b!r:.300}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r:.200} != {b!r:.200}"]


@pytest.fixture(scope="module")
def reference(model) -> Any:
    return _contract(_llama_cpp_python(), "llama_cpp", model)


@pytest.mark.parametrize("load", ["normal", "longhaul"])
def test_the_same_script_gives_the_same_answers(model, reference, load) -> None:
    ours = _contract(sys.executable, "longhaul_cpp", model, LONGHAUL if load == "longhaul" else None)
    assert _same(reference, ours) == []
    # the comparison is not empty: greedy text, grammar-constrained JSON, tool calls, logprobs, state
    tour = reference["tour"]
    assert tour["completion"]["choices"][0]["text"] and len(tour["ids"]) == 12
    assert tour["tool"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].startswith('{"colour"')
    assert reference["grammars"]["schema"].startswith('{"name"')
    streamed = [c["choices"][0]["logprobs"] for c in tour["stream_logprobs"][:-1]]
    assert streamed and all(lp["token_logprobs"][0] <= 0 for lp in streamed)
    assert any(len(lp["top_logprobs"][0]) == 2 for lp in streamed)
    assert tour["sampled"][0] != tour["sampled"][1]


def test_the_comparison_sees_a_difference(reference) -> None:
    """The sensitivity of the comparison: one changed character, one logprob moved by 1e-3, are found."""
    changed = json.loads(json.dumps(reference))
    changed["tour"]["stop"]["choices"][0]["text"] += "x"
    changed["tour"]["logprobs"]["choices"][0]["logprobs"]["token_logprobs"][0] += 1e-3
    assert len(_same(reference, changed)) == 2


def test_embeddings_are_llama_cpp_pythons(model) -> None:
    """A normal load with embedding=True: per-token vectors (pooling NONE) and mean-pooled ones, normalized and
    not, and create_embedding's response, equal to llama-cpp-python's."""
    theirs = _contract(_llama_cpp_python(), "llama_cpp", model, sections="embeddings")
    ours = _contract(sys.executable, "longhaul_cpp", model, sections="embeddings")
    assert _same(theirs, ours) == []
    e = theirs["embeddings"]
    assert e["pooling"] == 0 and e["mean"][0] == 1 and len(e["one"]) == 6 and len(e["mean"][1][0]) == SPEC.n_embd
    # several inputs with pooling NONE: each input's vectors are its own (llama-cpp-python 0.3.36 reads the
    # second and later inputs at an offset counted in tokens instead of floats: docs/llama-cpp-python.md)
    texts = ["hello", "a longer sentence to embed"]
    with Llama(model, n_ctx=256, n_batch=64, embedding=True, n_threads=2, verbose=False) as llm:
        together = llm.embed(texts)
        assert together == [llm.embed(t) for t in texts]
    with Llama(model, n_ctx=256, verbose=False, **LONGHAUL) as llm:
        with pytest.raises(RuntimeError, match="must be created with embedding=True"):
            llm.create_embedding("hello")


@pytest.mark.parametrize("load", ["normal", "longhaul"])
def test_a_model_without_a_chat_template_chats_as_llama_cpp_python(make_model, load) -> None:
    """No tokenizer.chat_template: llama-cpp-python's fallback, its "llama-2" format (llama-server's is chatml)."""
    path = make_model(**dataclasses.asdict(SPEC) | {"chat_template": False})[0]
    theirs = _contract(_llama_cpp_python(), "llama_cpp", path, sections="no_template")
    ours = _contract(sys.executable, "longhaul_cpp", path, LONGHAUL if load == "longhaul" else None,
                     sections="no_template")
    assert _same(theirs, ours) == []
    with Llama(path, n_ctx=64, verbose=False) as llm:
        assert llm.chat_format == "llama-2" and "tokenizer.chat_template" not in llm.metadata


ARCHS = [("qwen35moe", "q4_0"), ("laguna", "q8_0"), ("gpt-oss", "mxfp4"), ("deepseek2", "q8_0"),
         ("glm4moe", "f16"), ("llama4", "q4_0"), ("llama", "q8_0")]


@pytest.mark.parametrize("arch, expert_type", ARCHS)
def test_every_architecture_answers_as_llama_cpp_python(make_model, arch, expert_type) -> None:
    """Each MoE architecture the pinned upstream implements (and a dense one), with several expert types:
    the same completion, stream, chat, grammar and seeded sample as llama-cpp-python, in a normal load and in
    longhaul mode with half of the experts cached. (Inkling is this project's architecture: llama-cpp-python's
    upstream does not load it; its reference is tests/inkling_reference.py.)"""
    path = make_model(arch=arch, expert_type=expert_type)[0]
    theirs = _contract(_llama_cpp_python(), "llama_cpp", path, sections="brief")
    assert theirs["brief"]["completion"]["usage"]["completion_tokens"] >= 12
    assert _same(theirs, _contract(sys.executable, "longhaul_cpp", path, sections="brief")) == []
    info = inspect_model(path)
    if info.supported:
        lh = {"load_mode": "longhaul", "longhaul_cache_bytes": info.budget_for(max(1, SPEC.n_expert // 2))}
        assert _same(theirs, _contract(sys.executable, "longhaul_cpp", path, lh, sections="brief")) == []


SIGNATURES = """
import inspect, json, sys, importlib
m = importlib.import_module(sys.argv[1])
out = {}
for name in ["__init__", "create_completion", "__call__", "create_chat_completion", "tokenize", "detokenize",
             "save_state", "load_state", "set_seed", "reset", "eval", "generate", "sample", "embed",
             "create_embedding", "pooling_type", "n_ctx", "token_bos", "token_eos", "from_pretrained"]:
    sig = inspect.signature(getattr(m.Llama, name))
    out[name] = [(p.name, repr(p.default) if p.default is not p.empty else None, str(p.kind))
                 for p in sig.parameters.values()]
print(json.dumps(out))
"""


def test_signatures_match_llama_cpp_python() -> None:
    """Every llama-cpp-python argument, in its order, with its default; longhaul's own are keywords after."""
    theirs = json.loads(subprocess.run([_llama_cpp_python(), "-c", SIGNATURES, "llama_cpp"], capture_output=True,
                                       text=True, check=True).stdout)
    ours = json.loads(subprocess.run([sys.executable, "-c", SIGNATURES, "longhaul_cpp"], capture_output=True,
                                     text=True, check=True).stdout)
    for name, params in theirs.items():
        mine = ours[name]
        if name == "__init__":
            assert [p[0] for p in mine[-3:]] == ["load_mode", "longhaul_cache", "kwargs"]
            mine = mine[:-3] + mine[-1:]
        assert [p[0] for p in mine] == [p[0] for p in params], name
        assert [p[2] for p in mine] == [p[2] for p in params], name
        defaults = {p[0]: p[1] for p in params}
        # the llama_cpp constants print as their values
        assert {p[0]: p[1] for p in mine} == defaults, name


def _turn(llm: Llama, history: list[dict[str, str]]) -> tuple[str, int, int]:
    before = llm.longhaul_stats().total
    n_before = llm.n_tokens
    out = llm.create_chat_completion(history, max_tokens=8, temperature=0)["choices"][0]["message"]["content"]
    after = llm.longhaul_stats().total
    return out, after.bytes_read - before.bytes_read, n_before


def test_a_second_chat_turn_reads_no_expert_for_the_shared_history(model) -> None:
    first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
    with Llama(model, n_ctx=512, n_batch=8, n_threads=2, verbose=False, **LONGHAUL) as llm, \
            Llama(model, n_ctx=512, n_batch=8, n_threads=2, verbose=False, **LONGHAUL) as fresh:
        answer, _, _ = _turn(llm, first)
        second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And two more."}]
        prompt = llm.tokenize(llm._formatter(second, {}).prompt.encode(), add_bos=False, special=True)
        held = list(llm._input_ids)
        shared = next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b), min(len(held), len(prompt)))
        reply, read_reuse, _ = _turn(llm, second)
        # the same turn evaluated whole, on a context that held the same first turn
        _turn(fresh, first)
        fresh.reset()
        reply_fresh, read_whole, _ = _turn(fresh, second)
    assert reply == reply_fresh
    assert shared > 40  # the history is most of the second prompt
    assert read_reuse < read_whole, (read_reuse, read_whole)


def test_a_hybrid_model_starts_over_and_answers_the_same(make_model) -> None:
    """Qwen3.5 MoE keeps a recurrent state that cannot drop a suffix: a prompt sharing a prefix is evaluated
    again from the start, and the answer is a fresh context's."""
    path = make_model(arch="qwen35moe", n_expert=16, n_expert_used=4, expert_type="q8_0")[0]
    with Llama(path, n_ctx=256, n_threads=2, verbose=False, **LONGHAUL) as llm:
        a = llm("Shared prefix, then one", max_tokens=6, temperature=0)["choices"][0]["text"]
        b = llm("Shared prefix, then two", max_tokens=6, temperature=0)["choices"][0]["text"]
    with Llama(path, n_ctx=256, n_threads=2, verbose=False, **LONGHAUL) as llm:
        assert llm("Shared prefix, then two", max_tokens=6, temperature=0)["choices"][0]["text"] == b
        assert llm("Shared prefix, then one", max_tokens=6, temperature=0)["choices"][0]["text"] == a


@pytest.mark.parametrize("kw, name", [
    ({"embedding": True}, "embedding=True: embeddings are not supported in longhaul mode"),
    ({"lora_path": "adapter.gguf"}, "lora_path: LoRA adapters are not supported in longhaul mode"),
    ({"draft_model": object()}, "draft_model: speculative decoding is not supported in longhaul mode"),
    ({"vocab_only": True}, "vocab_only=True: vocabulary-only loading is not supported in longhaul mode"),
    ({"use_mlock": True}, "use_mlock=True: longhaul is a load mode of its own"),
])
def test_longhaul_refuses_by_name(model, kw, name) -> None:
    with pytest.raises(ValueError, match=name) as e:
        Llama(model, verbose=False, **LONGHAUL, **kw)
    assert "Load the model without longhaul" in str(e.value)


def test_arguments_llama_cpp_python_takes(model, capfd) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_gpu'"):
        Llama(model, n_gpu=3, verbose=False)
    with pytest.raises(NotImplementedError, match="draft_model: speculative decoding is not implemented"):
        Llama(model, draft_model=object(), verbose=False)
    # seed=-1 draws a random seed per request; verbose defaults to True (the library's log on stderr)
    with Llama(model, seed=-1, n_ctx=128, use_mmap=False, kv_overrides={"general.name": "renamed"}) as llm:
        texts = {llm("Random", max_tokens=8, temperature=1.0)["choices"][0]["text"] for _ in range(3)}
        assert len(texts) > 1
        with pytest.raises(ValueError, match="logprobs is not supported for models created with logits_all=False"):
            llm("x", logprobs=1)
        with pytest.raises(ValueError, match="suffix= .fill in the middle. needs a model with FIM tokens"):
            llm("x", suffix="y")
    assert "llama_model_loader" in capfd.readouterr().err
    Llama(model, numa=True, n_ctx=64, verbose=False).close()  # accepted (one NUMA node here)


def test_response_format_json_schema_is_honoured(model) -> None:
    """OpenAI's json_schema form (which llama-cpp-python 0.3.36 ignores) constrains the answer as json_object with
    the same schema does; without a response_format the answer is not JSON."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    msgs = [{"role": "user", "content": "A number, please."}]
    with Llama(model, n_ctx=256, n_threads=2, verbose=False) as llm:
        ask = lambda fmt: llm.create_chat_completion(msgs, max_tokens=10, temperature=0,  # noqa: E731
                                                     response_format=fmt)["choices"][0]["message"]["content"]
        a = ask({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        assert a == ask({"type": "json_object", "schema": schema}) and a.startswith('{"n":')
        assert not ask(None).startswith('{"n":')
