"""One script, run unchanged through llama-cpp-python's `llama_cpp` and through `longhaul_cpp` (only the import
differs): llama-cpp-python 0.3.36's own tests `test_real_llama`, `test_real_llama_repeated_prompt_cache` and
its grammar tests, adapted in the model path, n_ctx (the synthetic vocabulary is byte-level: one token per
byte) and their expected strings (which become what llama-cpp-python answers), then a side-by-side tour of
the high-level API. Prints one JSON document: what each call returned, ids and timestamps blanked.

    python lcp_contract.py MODULE MODEL [JSON of extra Llama keyword arguments] [SECTIONS, comma-separated]

Sections: real_llama, repeated_prompt_cache, grammars, tour (the default: all four); embeddings (a normal load
with embedding=True); no_template (MODEL carries no chat template); brief (a completion, a stream, a chat and a
grammar: the check run on every architecture).
"""
from __future__ import annotations

import importlib
import itertools
import json
import re
import sys
from typing import Any

MODULE, MODEL = sys.argv[1], sys.argv[2]
EXTRA: dict[str, Any] = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
SECTIONS = sys.argv[4].split(",") if len(sys.argv) > 4 else ["real_llama", "repeated_prompt_cache", "grammars", "tour"]
lc = importlib.import_module(MODULE)
Llama, LlamaGrammar, LogitsProcessorList = lc.Llama, lc.LlamaGrammar, lc.LogitsProcessorList
StoppingCriteriaList = lc.StoppingCriteriaList
N_CTX = 160  # llama-cpp-python's tests use 32 with a real tokenizer; these prompts are one token per byte


def llama(**kw: Any) -> Any:
    return Llama(MODEL, **{"n_threads": 2, "n_threads_batch": 2, "verbose": False, **EXTRA, **kw})


def blank(x: Any) -> Any:
    text = json.dumps(x, default=float)
    text = re.sub(r"cmpl-[0-9a-f-]{36}", "cmpl-X", text)
    return re.sub(r'"created": \d+', '"created": 0', text)


def test_real_llama() -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = llama(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=False, flash_attn=True)
    output = model.create_completion("The quick brown fox jumps over the lazy dog. The quick brown fox",
                                     max_tokens=6, top_k=50, top_p=0.9, temperature=0.0, seed=1337)
    out["greedy"] = output["choices"][0]["text"]
    output = model.create_completion("The capital of france is paris, 'true' or 'false'?:\n", max_tokens=4,
                                     top_k=50, top_p=0.9, temperature=0.8, seed=1337,
                                     grammar=LlamaGrammar.from_string('\nroot ::= "true" | "false"\n'))
    out["true_false"] = output["choices"][0]["text"]
    assert out["true_false"] in ("true", "false")
    tokens = model.tokenize(b"rot", add_bos=True, special=True)

    def logit_processor_func(input_ids: Any, logits: Any) -> Any:
        for token in tokens:
            logits[token] *= 1000
        return logits

    output = model.create_completion("The capital of france is par", max_tokens=4, top_k=50, top_p=0.9,
                                     temperature=0.8, seed=1337,
                                     logits_processor=LogitsProcessorList([logit_processor_func]))
    out["processor"] = output["choices"][0]["text"]
    model.set_seed(1337)
    state = model.save_state()
    numbers = LlamaGrammar.from_string('\nroot ::= "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "10"\n')
    pick = lambda: model.create_completion("Pick a number from 1 to 10?:\n", max_tokens=4, top_k=50,  # noqa: E731
                                           top_p=0.9, temperature=1.0, grammar=numbers)["choices"][0]["text"]
    number_1, number_2 = pick(), pick()
    model.load_state(state)
    number_3 = pick()
    assert number_1 == number_3, (number_1, number_3)
    out["numbers"] = [number_1, number_2, number_3]
    return out


def test_real_llama_repeated_prompt_cache() -> dict[str, Any]:
    model = llama(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=False, flash_attn=True)
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    output_1 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    output_2 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    assert output_2["choices"][0]["text"] == output_1["choices"][0]["text"]
    return {"text": output_1["choices"][0]["text"]}


def test_grammars() -> dict[str, Any]:
    """test_llama_grammar.py's grammars (a GBNF string; a JSON schema with nested objects, lists and anyOf),
    each used to constrain a greedy answer."""
    model = llama(n_ctx=256)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                  "required": ["x", "y"]},
        "kind": {"anyOf": [{"type": "integer"}, {"type": "boolean"}, {"enum": ["a", "b"]}]}},
        "required": ["name", "point", "kind"]}
    out = {}
    for name, g in [("string", LlamaGrammar.from_string('root ::= ("a" | "b" | "c")+ "!"')),
                    ("schema", LlamaGrammar.from_json_schema(json.dumps(schema)))]:
        out[name] = model("Data:", max_tokens=40, temperature=0, grammar=g)["choices"][0]["text"]
    return out


def tour() -> dict[str, Any]:
    """The rest of the high-level API, side by side."""
    out: dict[str, Any] = {}
    m = llama(n_ctx=256, logits_all=True, seed=7)
    out["completion"] = m("The quick brown fox", max_tokens=16, temperature=0)
    out["ids"] = list(itertools.islice(m.generate(m.tokenize(b"Token ids"), temp=0), 12))
    out["stream"] = list(m("Once upon a time", max_tokens=20, temperature=0, stream=True))
    out["stop"] = m("Once upon a time", max_tokens=40, temperature=0, stop=["a", "zz"])
    out["stream_stop"] = list(m("Once upon a time", max_tokens=40, temperature=0, stop=["a"], stream=True))
    out["echo_logprobs"] = m("abc", max_tokens=5, temperature=0, echo=True, logprobs=3)
    out["logprobs"] = m("abcd", max_tokens=5, temperature=0, logprobs=2)
    out["stream_logprobs"] = list(m("abcd", max_tokens=5, temperature=0, logprobs=2, stream=True))
    out["sampled"] = [m("Seeds", max_tokens=12, temperature=0.8, seed=s)["choices"][0]["text"] for s in (1, 2)]
    out["unseeded"] = [m("Seeds", max_tokens=8, temperature=1.0)["choices"][0]["text"] for _ in range(2)]
    out["mirostat"] = m("Seeds", max_tokens=8, temperature=0.8, mirostat_mode=2, seed=5)["choices"][0]["text"]
    out["typical"] = m("Seeds", max_tokens=8, temperature=0.8, typical_p=0.5, seed=5)["choices"][0]["text"]
    out["penalties"] = m("aaaa", max_tokens=12, temperature=0, repeat_penalty=1.3, frequency_penalty=0.5,
                         presence_penalty=0.5)["choices"][0]["text"]
    out["logit_bias"] = m("Bias", max_tokens=8, temperature=0, logit_bias={66: 5.0, 67: -100})["choices"][0]["text"]
    eos = m.token_eos()
    out["stopping"] = m("Criteria", max_tokens=12, temperature=0,
                        stopping_criteria=StoppingCriteriaList([lambda ids, _: len(ids) >= 14]))
    out["no_eos"] = m("End", max_tokens=6, temperature=0, logit_bias={eos: 100.0})
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
    out["chat"] = m.create_chat_completion(msgs, max_tokens=12, temperature=0)
    out["chat_stream"] = list(m.create_chat_completion(msgs, max_tokens=12, temperature=0, stream=True))
    out["chat_logprobs"] = m.create_chat_completion(msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    out["chat_json"] = m.create_chat_completion(msgs, max_tokens=24, temperature=0,
                                                response_format={"type": "json_object"})
    tools = [{"type": "function", "function": {"name": "paint", "parameters": {
        "type": "object", "properties": {"colour": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["colour", "n"]}}}]
    choice = {"type": "function", "function": {"name": "paint"}}
    out["tool"] = m.create_chat_completion(msgs, tools=tools, tool_choice=choice, max_tokens=32, temperature=0)
    out["tool_stream"] = list(m.create_chat_completion(msgs, tools=tools, tool_choice=choice, max_tokens=32,
                                                       temperature=0, stream=True))
    fmt = llama(n_ctx=256, chat_format="chatml")
    out["chatml"] = fmt.create_chat_completion(msgs, max_tokens=10, temperature=0)
    fmt = llama(n_ctx=256, chat_format="llama-2")
    out["llama2"] = fmt.create_chat_completion(msgs, max_tokens=10, temperature=0)
    ids = m.tokenize(b"hello <|im_start|>", add_bos=True, special=True)
    out["tokenize"] = [ids, m.tokenize(b"hello", add_bos=False), m.detokenize(ids).decode("utf-8", "replace"),
                       m.detokenize(ids, prev_tokens=ids[:1], special=True).decode("utf-8", "replace")]
    # save_state / load_state reproduce a continuation; reset and eval start over
    m.reset()
    m.eval(m.tokenize(b"State: "))
    state = m.save_state()
    first = m("State: more", max_tokens=8, temperature=0.9, seed=11)["choices"][0]["text"]
    m.load_state(state)
    again = m("State: more", max_tokens=8, temperature=0.9, seed=11)["choices"][0]["text"]
    assert first == again, (first, again)
    out["state"] = [first, state.n_tokens, len(state.input_ids)]
    out["repeat"] = [m("Again and again", max_tokens=10, temperature=0)["choices"][0]["text"] for _ in range(2)]
    assert out["repeat"][0] == out["repeat"][1]
    out["n_ctx"] = [m.n_ctx(), m.n_vocab(), m.token_bos(), m.token_eos()]
    return out


def embeddings() -> dict[str, Any]:
    """Per-token vectors (the generative model's pooling, NONE) and mean-pooled ones. Several inputs with pooling
    NONE are left out: llama-cpp-python 0.3.36 reads the second and later ones at a wrong offset (tokens, not
    floats), which test_llama_cpp_python.py checks separately."""
    m = llama(n_ctx=256, n_batch=64, embedding=True)
    texts = ["hello", "a longer sentence to embed", "x" * 100]
    out: dict[str, Any] = {"pooling": m.pooling_type(), "one": m.embed("hello"),
                           "alone": [m.embed(t, normalize=True) for t in texts],
                           "first": m.embed(texts)[0], "count": m.embed(texts, return_count=True)[1],
                           "after": m("Then a completion", max_tokens=6, temperature=0)["choices"][0]["text"]}
    mean = llama(n_ctx=256, n_batch=64, embedding=True, pooling_type=1)
    out["mean"] = [mean.pooling_type(), mean.embed(texts, normalize=True), mean.create_embedding(texts)]
    return out


def no_template() -> dict[str, Any]:
    """A model without tokenizer.chat_template: llama-cpp-python falls back to its "llama-2" format."""
    m = llama(n_ctx=256)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    return {"chat": m.create_chat_completion(msgs, max_tokens=8, temperature=0),
            "stream": list(m.create_chat_completion(msgs, max_tokens=8, temperature=0, stream=True))}


def brief() -> dict[str, Any]:
    m = llama(n_ctx=256)
    g = LlamaGrammar.from_json_schema(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                                  "required": ["n"]}))
    return {"completion": m("The quick brown fox", max_tokens=12, temperature=0),
            "stream": list(m("Once upon a time", max_tokens=8, temperature=0, stream=True)),
            "chat": m.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0),
            "grammar": m("JSON:", max_tokens=12, temperature=0, grammar=g)["choices"][0]["text"],
            "sampled": m("Seeds", max_tokens=8, temperature=0.9, seed=3)["choices"][0]["text"]}


if __name__ == "__main__":
    run = {"real_llama": test_real_llama, "repeated_prompt_cache": test_real_llama_repeated_prompt_cache,
           "grammars": test_grammars, "tour": tour, "embeddings": embeddings, "no_template": no_template,
           "brief": brief}
    print(blank({name: run[name]() for name in SECTIONS}))
