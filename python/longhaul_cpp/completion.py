"""Completions and chat completions of `Llama`, shaped and streamed as llama-cpp-python 0.3.36 shapes them:
the prompt's tokens (BOS, special tokens parsed), stop strings matched on bytes, a multi-byte character
held back until it is whole, streamed pieces that never hold the start of a stop string, logprobs from the
evaluated logits (logits_all=True), and the chat handler's stops, grammars and tool calls."""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._lib import lib
from .grammar import JSON_GBNF, LlamaGrammar
from .llama_types import LogitsProcessorList, StoppingCriteriaList

if TYPE_CHECKING:
    from .llama import Llama

Chunk = dict[str, Any]


@dataclasses.dataclass
class Request:
    prompt: str | list[int]
    suffix: str | None
    max_tokens: int | None
    logprobs: int | None
    echo: bool
    stop: str | list[str] | None
    stream: bool
    model: str | None
    stopping_criteria: StoppingCriteriaList | None
    logits_processor: LogitsProcessorList | None
    grammar: LlamaGrammar | None
    logit_bias: Mapping[Any, float] | None
    sampling: dict[str, Any]
    seed: int | None


def logits_to_logprobs(logits: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis in float32 (llama-cpp-python's `Llama.logits_to_logprobs`)."""
    top = np.amax(logits, axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0
    shifted = np.subtract(logits, top, dtype=np.single)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _prompt_tokens(llm: Llama, req: Request) -> list[int]:
    L, vocab = lib(), llm._model._vocab
    prompt = req.prompt
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (str, list, tuple)):
        raise ValueError("prompt must be a str or a list of token ids")
    if isinstance(prompt, str):
        bos = llm.token_bos()
        head = [bos] if L.llama_vocab_get_add_bos(vocab) and bos != -1 else []
        body = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=req.suffix is None) if prompt else []
        sep = int(L.llama_vocab_sep(vocab))
        tail = [sep if sep != -1 else llm.token_eos()] if L.llama_vocab_get_add_eos(vocab) or sep != -1 else []
    else:
        body = [int(t) for t in prompt]
        bad = [t for t in body if not 0 <= t < llm._n_vocab]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {llm._n_vocab}): {bad[:5]}")
        head, tail = [], []
    if req.suffix is not None:
        pre, suf, mid = (int(f(vocab)) for f in (L.llama_vocab_fim_pre, L.llama_vocab_fim_suf, L.llama_vocab_fim_mid))
        if -1 in (pre, suf, mid):
            raise ValueError("suffix= (fill in the middle) needs a model with FIM tokens (tokenizer.ggml.fim_pre/suf/"
                             "mid_token_id); this one has none: leave suffix out")
        s = llm.tokenize(req.suffix.encode("utf-8"), add_bos=False, special=False)
        parts = [[suf] + s, [pre] + body] if llm.spm_infill else [[pre] + body, [suf] + s]
        body = parts[0] + parts[1] + [mid]
        head = [llm.token_bos()] if L.llama_vocab_get_add_bos(vocab) and llm.token_bos() != -1 else []
        tail = []
    tokens = head + body + tail
    if not tokens:
        raise ValueError("the prompt is empty (no tokens): give some text or token ids")
    return tokens


def run(llm: Llama, req: Request) -> Iterator[Chunk]:
    """Checks the request now (errors raise at the call, streamed or not) and returns the chunks' iterator:
    one whole response, or the streamed chunks."""
    tokens = _prompt_tokens(llm, req)
    n_ctx = llm._n_ctx
    if len(tokens) >= n_ctx:
        raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {n_ctx}")
    mt = req.max_tokens
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int)):
        raise ValueError(f"max_tokens must be an integer or None, got {mt!r}")
    limit = n_ctx - len(tokens) if mt is None or mt <= 0 else min(mt, n_ctx - len(tokens))
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise ValueError(f"stop must be a string or a list of strings, got {req.stop!r}")
    if req.logprobs is not None:
        if isinstance(req.logprobs, bool) or not isinstance(req.logprobs, int) or req.logprobs < 0:
            raise ValueError(f"logprobs must be None or an integer >= 0, got {req.logprobs!r}")
        if not llm._logits_all:
            raise ValueError("logprobs is not supported for models created with logits_all=False")
    processors = req.logits_processor
    if req.logit_bias:
        bias = {int(k): float(v) for k, v in req.logit_bias.items()}

        def add_bias(_: np.ndarray, scores: np.ndarray) -> np.ndarray:
            out = np.copy(scores)
            for t, b in bias.items():
                out[t] = scores[t] + b
            return out
        processors = LogitsProcessorList([*(processors or []), add_bias])
    if tokens[:2] == [llm.token_bos()] * 2:
        warnings.warn(f'Detected duplicate leading "{llm._model.token_get_text(llm.token_bos())}" in prompt, this '
                      "will likely reduce response quality, consider removing it...", RuntimeWarning, stacklevel=3)
    llm._next_seed(req.seed)
    gen = llm.generate(tokens, **req.sampling, stopping_criteria=req.stopping_criteria, logits_processor=processors,
                       grammar=req.grammar)
    head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
            "model": req.model if req.model is not None else llm.model_path}
    return _Completion(llm, req, tokens, limit, [s.encode("utf-8") for s in stops], gen, head).chunks()


class _Completion:
    def __init__(self, llm: Llama, req: Request, tokens: list[int], limit: int, stops: list[bytes],
                 gen: Iterator[int], head: Chunk) -> None:
        self.llm, self.req, self.tokens, self.limit, self.stops, self.gen, self.head = \
            llm, req, tokens, limit, stops, gen, head
        self.out: list[int] = []
        self.sent = 0  # completion tokens streamed so far
        self.prompt_len = len(req.prompt)

    def chunk(self, text: str, logprobs: Any = None, finish: str | None = None) -> Chunk:
        return self.head | {"choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}

    def top(self, row: np.ndarray, token: int, token_str: str) -> tuple[float, dict[str, float]]:
        lp = logits_to_logprobs(row)
        order = np.lexsort((-np.arange(len(lp)), -lp))[:self.req.logprobs]  # by logprob, then the larger id
        top = {self.llm.detokenize([int(i)]).decode("utf-8", "ignore"): float(lp[i]) for i in order}
        top[token_str] = float(lp[token])
        return float(lp[token]), top

    def token_entry(self, token: int, offset: int) -> dict[str, Any]:
        token_str = self.llm.detokenize([token]).decode("utf-8", "ignore")
        lp, top = self.top(self.llm._scores[len(self.tokens) + self.sent - 1], token, token_str)
        return {"tokens": [token_str], "text_offset": [offset], "token_logprobs": [lp], "top_logprobs": [top]}

    def chunks(self) -> Iterator[Chunk]:
        llm, detok, stream = self.llm, self.llm.detokenize, self.req.stream
        finish, text, fix = "length", None, 0
        for token in self.gen:
            if llm._model.is_eog(token):
                text, finish = detok(self.out), "stop"
                break
            self.out.append(token)
            all_text = detok(self.out)
            for i, byte in enumerate(all_text[-3:]):  # a character's first bytes: wait for the rest
                for need, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0)):
                    if need > 3 - i and byte & lead == lead:
                        fix = need - (3 - i)
            if fix > 0:
                fix -= 1
                continue
            hits = [s for s in self.stops if s in all_text]
            if hits:
                text, finish = all_text[:all_text.index(hits[0])], "stop"
                break
            if stream:
                yield from self.stream_ready()
            if len(self.out) >= self.limit:
                text, finish = detok(self.out), "length"
                break
        crit = self.req.stopping_criteria
        if crit is not None and crit(llm._input_ids, llm._ctx.logits().copy()):
            text, finish = detok(self.out), "stop"
        self.gen.close()
        if stream:
            yield from self.stream_tail()
            yield self.chunk("", None, finish)
            return
        yield self.whole(text or b"", finish)

    def stream_ready(self) -> Iterator[Chunk]:
        """Stream the tokens whose text is final: whole characters, never the start of a stop string."""
        detok = self.llm.detokenize
        rest = self.out[self.sent:]
        rest_text = detok(rest)
        hold = max([k for s in self.stops for k in range(min(len(s), len(rest_text)), 0, -1)
                    if rest_text.endswith(s[:k])] or [0])
        pos = 0
        if self.req.logprobs is not None:
            for token in rest:
                if token == self.llm.token_bos():
                    continue
                pos += len(detok([token]))
                if pos > len(rest_text) - hold:
                    break
                offset = self.prompt_len + len(detok(self.out[:self.sent]).decode("utf-8", "ignore"))
                entry = self.token_entry(token, offset)
                self.sent += 1
                yield self.chunk(detok([token]).decode("utf-8", "ignore"), entry)
            return
        while rest:
            for i in range(1, len(rest) + 1):
                try:
                    piece = detok(rest[:i]).decode("utf-8")
                    break
                except UnicodeDecodeError:
                    continue
            else:
                return
            pos += len(piece.encode("utf-8"))
            if pos > len(rest_text) - hold:
                return
            rest = rest[i:]
            self.sent += i
            yield self.chunk(piece)

    def stream_tail(self) -> Iterator[Chunk]:
        """The tokens not streamed yet, cut at a stop string."""
        detok = self.llm.detokenize
        rest = self.out[self.sent:]
        rest_text = detok(rest)
        hits = [rest_text.index(s) for s in self.stops if s in rest_text]
        end = min(hits) if hits else len(rest_text)
        pos = 0
        for token in rest:
            piece = detok([token])
            pos += len(piece)
            entry = None
            if self.req.logprobs is not None:
                if token == self.llm.token_bos():
                    continue
                entry = self.token_entry(token, self.prompt_len + len(detok(self.out[:self.sent])))
            self.sent += 1
            if pos >= end:
                yield self.chunk(piece[:len(piece) - (pos - end)].decode("utf-8", "ignore"), entry)
                return
            yield self.chunk(piece.decode("utf-8", "ignore"), entry)

    def whole(self, text: bytes, finish: str) -> Chunk:
        req, llm = self.req, self.llm
        out = text.decode("utf-8", "ignore")
        if req.echo:
            out = (req.prompt if isinstance(req.prompt, str) else
                   llm.detokenize(req.prompt).decode("utf-8", "ignore")) + out
        lp = self.whole_logprobs() if req.logprobs is not None else None
        n_prompt, n_out = len(self.tokens), len(self.out)
        return self.chunk(out, lp, finish) | {
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}

    def whole_logprobs(self) -> dict[str, Any]:
        req, llm, detok = self.req, self.llm, self.llm.detokenize
        bos = llm.token_bos()
        base = 0 if req.echo else self.prompt_len
        first_row = 0 if req.echo else len(self.tokens) - 1
        seq = (self.tokens[1 if self.tokens[0] == bos else 0:] + self.out) if req.echo else list(self.out)
        rows = llm._scores[first_row:]
        tokens, offsets, lps, tops = [], [], [], []
        for idx, (token, row) in enumerate(zip(seq, rows)):
            if token == bos:
                continue
            token_str = detok([token]).decode("utf-8", "ignore")
            offsets.append(base + len(detok(seq[:idx]).decode("utf-8", "ignore")))
            tokens.append(token_str)
            lp, top = self.top(row, token, token_str)
            lps.append(lp)
            tops.append(top)
        if req.echo and seq:
            lps[0], tops[0] = None, None
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps, "top_logprobs": tops}


# -- chat --
def _chat_logprobs(lp: Mapping[str, Any] | None) -> Any:
    if lp is None:
        return None
    return {"content": [{"token": t, "bytes": None, "logprob": p,
                         "top_logprobs": [{"token": k, "logprob": v, "bytes": None} for k, v in (top or {}).items()]}
                        for t, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])],
            "refusal": None}


def _response_grammar(response_format: Mapping[str, Any] | None) -> LlamaGrammar | None:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":  # OpenAI's form; llama-cpp-python 0.3.36 ignores it, this package honours it
        schema = (response_format.get("json_schema") or {}).get("schema")
    else:
        return None
    return LlamaGrammar.from_string(JSON_GBNF) if schema is None else LlamaGrammar.from_json_schema(json.dumps(schema))


def chat(llm: Llama, formatter: Any, *, messages: Any, functions: Any, function_call: Any, tools: Any,
         tool_choice: Any, stream: bool, stop: Any, response_format: Any, grammar: Any, logprobs: Any,
         top_logprobs: Any, **kw: Any) -> Any:
    result = formatter(messages, {"functions": functions, "function_call": function_call, "tools": tools,
                                  "tool_choice": tool_choice})
    prompt = llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
    stop = ([] if stop is None else [stop] if isinstance(stop, str) else list(stop)) + result.stop
    criteria = None
    if result.stop_token_ids:
        ids = set(result.stop_token_ids)
        criteria = StoppingCriteriaList([lambda tokens, _: len(tokens) > 0 and int(tokens[-1]) in ids])
    grammar = _response_grammar(response_format) or grammar
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if isinstance(function_call, str) and function_call in ("none", "auto"):
        tool_choice = function_call
    elif isinstance(function_call, Mapping) and "name" in function_call:
        tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    tool = None
    if isinstance(tool_choice, Mapping) and tools is not None:
        name = tool_choice["function"]["name"]
        tool = next((t for t in tools if t["function"]["name"] == name), None)
        if tool is None:
            raise ValueError(f"Tool choice '{name}' not found in tools.")
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(tool["function"]["parameters"]))
        except (ValueError, KeyError):
            grammar = LlamaGrammar.from_string(JSON_GBNF)
    out = llm.create_completion(prompt=prompt, logprobs=top_logprobs if logprobs else None, stream=stream, stop=stop,
                                stopping_criteria=criteria, grammar=grammar, **kw)
    if tool is not None:
        return _tool_call(tool["function"]["name"], out, stream)
    return _chat_chunks(out) if stream else _chat_whole(out)


def _chat_whole(c: Chunk) -> Chunk:
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                         "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}],
            "usage": c["usage"]}


def _chat_chunks(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    for i, c in enumerate(chunks):
        head = {"id": "chat" + c["id"], "model": c["model"], "created": c["created"], "object": "chat.completion.chunk"}
        if i == 0:
            yield head | {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                       "finish_reason": None}]}
        ch = c["choices"][0]
        yield head | {"choices": [{"index": 0, "delta": {"content": ch["text"]} if ch["finish_reason"] is None else {},
                                   "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}]}


def _tool_call(name: str, out: Any, stream: bool) -> Any:
    def call(cid: str, args: str, index: bool) -> dict[str, Any]:
        return ({"index": 0} if index else {}) | {"id": f"call__0_{name}_{cid}", "type": "function",
                                                   "function": {"name": name, "arguments": args}}
    if not stream:
        ch = out["choices"][0]
        return {"id": "chat" + out["id"], "object": "chat.completion", "created": out["created"], "model": out["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                     "function_call": {"name": name, "arguments": ch["text"]},
                                                     "tool_calls": [call(out["id"], ch["text"], False)]},
                             "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": "tool_calls"}],
                "usage": out["usage"]}

    def chunks() -> Iterator[Chunk]:
        head: Chunk | None = None
        for c in out:
            if head is None:
                head = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                        "model": c["model"]}
                yield head | {"choices": [{"index": 0, "finish_reason": None, "logprobs": None, "delta": {
                    "role": "assistant", "content": None, "function_call": None, "tool_calls": None}}]}
            ch = c["choices"][0]
            yield head | {"choices": [{"index": 0, "finish_reason": None, "logprobs": _chat_logprobs(ch["logprobs"]),
                                       "delta": {"role": None, "content": None,
                                                 "function_call": {"name": name, "arguments": ch["text"]},
                                                 "tool_calls": [call(c["id"], ch["text"], True)]}}]}
        if head is not None:
            yield head | {"choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "delta": {
                "role": None, "content": None, "function_call": None, "tool_calls": None}}]}
    return chunks()
