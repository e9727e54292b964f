"""`longhaul_cpp.Llama` on its own: greedy token ids equal llama-server's for the same prompt and load, max_tokens,
usage and logprobs, seeded sampling in the library's sampler chain, the errors a wrong argument gets, and a normal
load's answers. Its equality with llama-cpp-python itself is test_llama_cpp_python.py's."""
from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from longhaul_cpp import Llama, LlamaError, SyntheticSpec, plain_expert_banks
from textstream import TextStream, incomplete_utf8_tail
from test_tools_longhaul import server

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")
N_CTX = 512
LOAD = ("--longhaul", "--longhaul-cache", "512KiB")  # 10 of 16 slots per layer: misses, waves
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def model(make_model) -> Path:
    return make_model(**dataclasses.asdict(SPEC))[0]


@pytest.fixture(scope="module")
def llm(model):
    # flash attention as llama-server's default (auto) chooses it on the CPU; llama-cpp-python's default is off
    with Llama(model, n_ctx=N_CTX, load_mode="longhaul", longhaul_cache="512KiB", n_threads=2, flash_attn=True,
               verbose=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def base(model):
    with server(model, "-c", str(N_CTX), "-np", "1", *LOAD) as base:
        yield base


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def _usage(d: dict[str, Any]) -> tuple[int, int, int]:
    u = d["usage"]
    return u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]


def test_greedy_tokens_equal_server(llm, base) -> None:
    """The same greedy token ids as llama-server for the same prompt and load. (The text of a completion follows
    llama-cpp-python's rules, tested side by side in test_llama_cpp_python.py: bytes that are not UTF-8 are
    dropped, where llama-server writes U+FFFD; chat prompts use the model's template as llama-cpp-python
    renders it.)"""
    for prompt in ("The quick brown fox", "Once upon a time"):
        theirs = _post(base, "/completion", {"prompt": prompt, "n_predict": 24, "temperature": 0,
                                             "return_tokens": True})["tokens"]
        ours = []
        for tok in llm.generate(llm.tokenize(prompt.encode()), temp=0):
            if llm.model.is_eog(tok) or len(ours) == 24:
                break
            ours.append(tok)
        assert ours == theirs and len(ours) > 0


def test_max_tokens_usage_echo_and_logprobs(model) -> None:
    with Llama(model, n_ctx=N_CTX, load_mode="longhaul", longhaul_cache="512KiB", n_threads=2, logits_all=True,
               verbose=False) as llm:
        r = llm("abc", max_tokens=5, temperature=0, logprobs=3)
        n_prompt = len(llm.tokenize(b"abc"))
        choice = r["choices"][0]
        lp = choice["logprobs"]
        n = _usage(r)[1]
        assert _usage(r) == (n_prompt, n, n_prompt + n) and n >= 5  # more when the 5th ends inside a character
        assert choice["finish_reason"] == "length"
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
        # greedy: each chosen token is the likeliest, and log-probabilities are <= 0
        assert all(p <= 0 and p == pytest.approx(max(top.values()))
                   for p, top in zip(lp["token_logprobs"], lp["top_logprobs"]))
        assert lp["text_offset"][0] == 3
        # echo: the prompt's tokens (without BOS) come first, the first without a logprob
        e = llm("abc", max_tokens=5, temperature=0, echo=True, logprobs=3)["choices"][0]
        assert e["text"] == "abc" + choice["text"] and e["logprobs"]["tokens"][:3] == ["a", "b", "c"]
        assert e["logprobs"]["token_logprobs"][0] is None and e["logprobs"]["token_logprobs"][3:] == pytest.approx(
            lp["token_logprobs"])
        # a token-id prompt is the same request as its text
        ids = llm.tokenize(b"abc")
        assert llm(ids, max_tokens=5, temperature=0)["choices"][0]["text"] == choice["text"]


def test_sampling_is_seeded_in_the_library(llm) -> None:
    kw = dict(max_tokens=24, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = llm("Seeds", seed=1, **kw)["choices"][0]["text"]
    assert llm("Seeds", seed=1, **kw)["choices"][0]["text"] == a
    others = {llm("Seeds", seed=s, **kw)["choices"][0]["text"] for s in (2, 3, 4)}
    assert others - {a}  # different seeds draw differently
    greedy = llm("Seeds", max_tokens=24, temperature=0)["choices"][0]["text"]
    assert {a} | others != {greedy}
    # top_k=1 leaves only the likeliest token whatever the temperature
    assert llm("Seeds", max_tokens=24, temperature=1.5, top_k=1, seed=9)["choices"][0]["text"] == greedy


def test_tokenize_detokenize_and_stats(llm) -> None:
    ids = llm.tokenize(b"hello")
    assert ids[0] == 1 and llm.detokenize(ids[1:]) == b"hello"
    assert llm.tokenize("hello", add_bos=False) == ids[1:]
    stats = llm.longhaul_stats()
    assert stats.total.n_slots == 4 * 10 and stats.total.n_hits + stats.total.n_misses > 0


@pytest.mark.parametrize("call, error, message", [
    (lambda l: l("x", temperature=float("nan")), ValueError, "temperature=nan is out of range"),
    (lambda l: l("x", repeat_penalty=0), ValueError, "repeat_penalty=0 is out of range"),
    (lambda l: l("x", mirostat_mode=3), ValueError, "mirostat_mode=3 is out of range"),
    (lambda l: l("x", stop=[1]), ValueError, "stop must be a string or a list of strings"),
    (lambda l: l("x", logprobs=-1), ValueError, "logprobs must be None or an integer"),
    (lambda l: l("x", max_tokens="5"), ValueError, "max_tokens must be an integer"),
    (lambda l: l("x" * 2000), ValueError, r"Requested tokens \(2001\) exceed context window of 512"),
    (lambda l: l([999999]), ValueError, "prompt token ids out of range"),
    (lambda l: l.create_chat_completion([]), ValueError, "messages must be a non-empty list"),
    (lambda l: l.create_chat_completion([{"content": "hi"}]), ValueError, r"messages\[0\] must be a dict"),
    (lambda l: l("x", frequency_penalty=float("nan")), ValueError, "frequency_penalty=nan is out of range"),
    (lambda l: l("x", foo=1), TypeError, "foo"),
])
def test_wrong_arguments(llm, call, error, message) -> None:
    with pytest.raises(error, match=message):
        call(llm)


def test_constructor_errors(model) -> None:
    with pytest.raises(ValueError, match="unknown load_mode 'fast'"):
        Llama(model, load_mode="fast")
    with pytest.raises(ValueError, match="give the expert cache budget of LoadMode.LONGHAUL"):
        Llama(model, load_mode="longhaul")
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_gpu'"):
        Llama(model, n_gpu=3)
    with pytest.raises(FileNotFoundError):
        Llama(model.with_name("missing.gguf"))
    with Llama(model, chat_format="no-such-template") as llm:
        with pytest.raises(LlamaError, match="is not one the library knows: pass chat_format="):
            llm.create_chat_completion(MESSAGES)


def test_normal_load_and_longhaul_give_the_same_answers(model, llm) -> None:
    with plain_expert_banks(), Llama(model, n_ctx=N_CTX, n_threads=2, flash_attn=True, verbose=False) as plain:
        ref = plain.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)
    # with the plain expert layout a normal load runs longhaul's kernels: the same text
    got = llm.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)
    assert got["choices"][0]["message"] == ref["choices"][0]["message"]


def test_text_stream_holds_split_characters_and_stop_prefixes() -> None:
    assert incomplete_utf8_tail(b"a\xe2\x82") == 2 and incomplete_utf8_tail(b"a\xe2\x82\xac") == 0
    s = TextStream(["END"])
    assert s.push(b"x\xe2") == ("x", False)         # the euro sign waits for its last bytes
    assert s.push(b"\x82\xacE") == ("\u20ac", False)  # "E" may begin "END"
    assert s.push(b"N") == ("", False)
    assert s.push(b"Dtail") == ("", True)            # the stop string and what follows are dropped
    assert s.flush() == ""
    t = TextStream(["END"])
    assert t.push(b"aEN") == ("a", False) and t.push(b"x") == ("ENx", False)
    assert t.push(b"\xff") == ("\ufffd", False) and t.push(b"\xe2") == ("", False) and t.flush() == "\ufffd"
