"""`longhaul_cpp.Llama`, the llama-cpp-python-style API: greedy answers equal llama-server's OpenAI endpoints for
the same requests on the same model and load mode (streamed and not), stop strings, max_tokens, usage counts,
seeded sampling in the library's sampler chain, and the errors a wrong argument gets."""
from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from longhaul_cpp import Llama, LlamaError, SyntheticSpec, plain_expert_banks
from longhaul_cpp.textstream import TextStream, incomplete_utf8_tail
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
    with Llama(model, n_ctx=N_CTX, load_mode="longhaul", longhaul_cache="512KiB", n_threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def base(model):
    with server(model, "-c", str(N_CTX), "-np", "1", *LOAD) as base:
        yield base


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def _post_stream(base: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(base + path, json.dumps(body | {"stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def _completion_text(chunks: list[dict[str, Any]]) -> tuple[str, str | None]:
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    return text, reasons[-1] if reasons else None


def _chat_text(chunks: list[dict[str, Any]]) -> tuple[str, str | None]:
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    return text, reasons[-1] if reasons else None


def _usage(d: dict[str, Any]) -> tuple[int, int, int]:
    u = d["usage"]
    return u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]


def _ascii_stop(text: str) -> str:
    """A stop string taken from the middle of a greedy answer: two printable ASCII characters."""
    for i in range(4, len(text) - 1):
        if text[i:i + 2].isascii() and text[i:i + 2].isprintable():
            return text[i:i + 2]
    pytest.skip("no printable ASCII pair in the greedy answer to stop on")


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_server(llm, base, stream) -> None:
    req = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
    if stream:
        ours = list(llm.create_completion(req["prompt"], max_tokens=24, temperature=0, stream=True))
        theirs = _post_stream(base, "/v1/completions", req)
        assert _completion_text(ours) == _completion_text(theirs)
        assert all(c["object"] == "text_completion" and c["id"] == ours[0]["id"] for c in ours)
        assert _usage(ours[-1])[:2] == (len(llm.tokenize("The quick brown fox")), 24)
    else:
        ours = llm("The quick brown fox", max_tokens=24, temperature=0)
        theirs = _post(base, "/v1/completions", req)
        assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
        assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"] == "length"
        assert _usage(ours) == _usage(theirs)
        assert set(ours) == {"id", "object", "created", "model", "choices", "usage"}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_equals_server(llm, base, stream) -> None:
    req = {"messages": MESSAGES, "max_tokens": 20, "temperature": 0}
    if stream:
        ours = list(llm.create_chat_completion(MESSAGES, max_tokens=20, temperature=0, stream=True))
        theirs = _post_stream(base, "/v1/chat/completions", req)
        assert _chat_text(ours) == _chat_text(theirs)
        assert ours[0]["choices"][0]["delta"] == {"role": "assistant"}
        assert all(c["object"] == "chat.completion.chunk" for c in ours)
    else:
        ours = llm.create_chat_completion(MESSAGES, max_tokens=20, temperature=0)
        theirs = _post(base, "/v1/chat/completions", req)
        assert ours["object"] == "chat.completion"
        assert ours["choices"][0]["message"] == {"role": "assistant",
                                                 "content": theirs["choices"][0]["message"]["content"]}
        assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
        assert _usage(ours) == _usage(theirs)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_equal_server(llm, base, stream) -> None:
    full = llm("Once upon a time", max_tokens=48, temperature=0)["choices"][0]["text"]
    stop = _ascii_stop(full)
    req = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "stop": [stop, "never-seen"]}
    if stream:
        ours = _completion_text(list(llm("Once upon a time", max_tokens=48, temperature=0, stop=[stop, "never-seen"],
                                         stream=True)))
        theirs = _completion_text(_post_stream(base, "/v1/completions", req))
        assert ours == theirs
        text = ours[0]
    else:
        r = llm("Once upon a time", max_tokens=48, temperature=0, stop=[stop, "never-seen"])
        theirs = _post(base, "/v1/completions", req)
        assert r["choices"][0]["text"] == theirs["choices"][0]["text"]
        assert _usage(r) == _usage(theirs)
        text = r["choices"][0]["text"]
        assert r["choices"][0]["finish_reason"] == "stop"
    assert text == full[:full.index(stop)]


def test_max_tokens_usage_echo_and_logprobs(llm) -> None:
    r = llm("abc", max_tokens=5, temperature=0, echo=True, logprobs=3)
    n_prompt = len(llm.tokenize("abc"))
    assert _usage(r) == (n_prompt, 5, n_prompt + 5)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"].startswith("abc")
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    # greedy: each chosen token is the likeliest, and log-probabilities are <= 0
    assert all(p <= 0 and p == pytest.approx(max(top.values())) for p, top in zip(lp["token_logprobs"], lp["top_logprobs"]))
    assert lp["text_offset"][0] == 3
    # a token-id prompt is the same request as its text
    ids = llm.tokenize("abc")
    assert llm(ids, max_tokens=5, temperature=0)["choices"][0]["text"] == choice["text"][3:]


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
    (lambda l: l("x", temperature=-1), ValueError, "temperature=-1 is out of range"),
    (lambda l: l("x", top_p=2), ValueError, "top_p=2 is out of range"),
    (lambda l: l("x", seed=-5), ValueError, "seed=-5 is out of range"),
    (lambda l: l("x", stop=[1]), ValueError, "stop must be a string or a list of strings"),
    (lambda l: l("x", logprobs=99), ValueError, "logprobs must be None or an integer"),
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
    with pytest.raises(TypeError, match="unknown llama_model_params field 'n_gpu'"):
        Llama(model, n_gpu=3)
    with pytest.raises(FileNotFoundError):
        Llama(model.with_name("missing.gguf"))
    with Llama(model, chat_format="no-such-template") as llm:
        with pytest.raises(LlamaError, match="chat_format= a built-in name"):
            llm.create_chat_completion(MESSAGES)


def test_normal_load_and_longhaul_give_the_same_answers(model, llm) -> None:
    with plain_expert_banks(), Llama(model, n_ctx=N_CTX, n_threads=2) as plain:
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
