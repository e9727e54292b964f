"""Completions of `Llama`, shaped and streamed as llama-cpp-python 0.3.36 shapes them: the prompt's tokens (BOS,
special tokens parsed), stop strings matched on bytes, a multi-byte character held back until it is whole,
streamed pieces that never hold the start of a stop string, logprobs from the evaluated logits (logits_all=True).
Chat completions (chat.py) run on them."""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import random
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._lib import lib
from .grammar import LlamaGrammar
from .llama_types import LogitsProcessorList, StoppingCriteriaList

if TYPE_CHECKING:
    from ..context import Context
    from ..model import Model

Chunk = dict[str, Any]


# set by create_chat_completion while it parses tool calls: the completion's text then keeps the special tokens
# that mark them (gpt-oss's channels, Kimi K2's and DeepSeek's call sections)
RENDER_SPECIAL: contextvars.ContextVar[bool] = contextvars.ContextVar("RENDER_SPECIAL", default=False)


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
    special: bool = False  # the text renders special tokens (the tool-call parsers read their markers)


def logits_to_logprobs(logits: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis in float32 (llama-cpp-python's `Llama.logits_to_logprobs`)."""
    top = np.amax(logits, axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0
    shifted = np.subtract(logits, top, dtype=np.single)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


class CompletionMixin:
    """`Llama`'s completions (create_completion, __call__): the state they use is Llama's, set by its
    constructor."""

    _model: Model
    _ctx: Context
    _n_ctx: int
    _n_vocab: int
    _seed: int
    _logits_all: bool
    _scores: np.ndarray
    _input_ids: np.ndarray
    spm_infill: bool
    model_path: str

    if TYPE_CHECKING:  # Llama's own methods
        def token_bos(self) -> int: ...
        def token_eos(self) -> int: ...
        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
        def detokenize(self, tokens: Any, prev_tokens: Any = None, special: bool = False) -> bytes: ...
        def set_seed(self, seed: int) -> None: ...
        def generate(self, tokens: Any, **kw: Any) -> Iterator[int]: ...

    def _next_seed(self, seed: int | None) -> int:
        """The seed of a request: its own, or the next of the Llama's sequence (llama-cpp-python's rule)."""
        self.set_seed(seed if seed is not None else random.Random(self._seed).randint(0, 2**32))
        return self._seed

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: int | None = None, echo: bool = False, stop: str | list[str] | None = [],  # noqa: B006
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                          top_k: int = 40, stream: bool = False, seed: int | None = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: str | None = None, stopping_criteria: StoppingCriteriaList | None = None,
                          logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
                          logit_bias: dict[int, float] | None = None) -> Any:
        """An OpenAI `text_completion` dict, or with stream=True an iterator of its chunks."""
        req = Request(prompt=prompt, suffix=suffix, max_tokens=max_tokens, logprobs=logprobs, echo=echo,
                       stop=stop, stream=stream, model=model, stopping_criteria=stopping_criteria,
                                  logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias,
                                  sampling=dict(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                                                temp=temperature, repeat_penalty=repeat_penalty,
                                                frequency_penalty=frequency_penalty,
                                                presence_penalty=presence_penalty, tfs_z=tfs_z,
                                                mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                                                mirostat_eta=mirostat_eta), seed=seed,
                       special=RENDER_SPECIAL.get())
        chunks = self._completion_chunks(req)
        return chunks if stream else next(chunks)

    __call__ = create_completion

    def _prompt_tokens(self, req: Request) -> list[int]:
        L, vocab = lib(), self._model._vocab
        prompt = req.prompt
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (str, list, tuple)):
            raise ValueError("prompt must be a str or a list of token ids")
        if isinstance(prompt, str):
            bos = self.token_bos()
            head = [bos] if L.llama_vocab_get_add_bos(vocab) and bos != -1 else []
            body = self.tokenize(prompt.encode("utf-8"), add_bos=False, special=req.suffix is None) if prompt else []
            sep = int(L.llama_vocab_sep(vocab))
            tail = [sep if sep != -1 else self.token_eos()] if L.llama_vocab_get_add_eos(vocab) or sep != -1 else []
        else:
            body = [int(t) for t in prompt]
            bad = [t for t in body if not 0 <= t < self._n_vocab]
            if bad:
                raise ValueError(f"prompt token ids out of range [0, {self._n_vocab}): {bad[:5]}")
            head, tail = [], []
        if req.suffix is not None:
            pre, suf, mid = (int(f(vocab)) for f in (L.llama_vocab_fim_pre, L.llama_vocab_fim_suf, L.llama_vocab_fim_mid))
            if -1 in (pre, suf, mid):
                raise ValueError("suffix= (fill in the middle) needs a model with FIM tokens (tokenizer.ggml.fim_pre/suf/"
                                 "mid_token_id); this one has none: leave suffix out")
            s = self.tokenize(req.suffix.encode("utf-8"), add_bos=False, special=False)
            parts = [[suf] + s, [pre] + body] if self.spm_infill else [[pre] + body, [suf] + s]
            body = parts[0] + parts[1] + [mid]
            head = [self.token_bos()] if L.llama_vocab_get_add_bos(vocab) and self.token_bos() != -1 else []
            tail = []
        tokens = head + body + tail
        if not tokens:
            raise ValueError("the prompt is empty (no tokens): give some text or token ids")
        return tokens


    def _completion_chunks(self, req: Request) -> Iterator[Chunk]:
        """Checks the request now (errors raise at the call, streamed or not) and returns the chunks' iterator:
        one whole response, or the streamed chunks."""
        tokens = self._prompt_tokens(req)
        n_ctx = self._n_ctx
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
            if not self._logits_all:
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
        if tokens[:2] == [self.token_bos()] * 2:
            warnings.warn(f'Detected duplicate leading "{self._model.token_get_text(self.token_bos())}" in prompt, this '
                          "will likely reduce response quality, consider removing it...", RuntimeWarning, stacklevel=3)
        self._next_seed(req.seed)
        gen = self.generate(tokens, **req.sampling, stopping_criteria=req.stopping_criteria, logits_processor=processors,
                           grammar=req.grammar)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": req.model if req.model is not None else self.model_path}
        return _Completion(self, req, tokens, limit, [s.encode("utf-8") for s in stops], gen, head).chunks()


class _Completion:
    def __init__(self, llm: CompletionMixin, req: Request, tokens: list[int], limit: int, stops: list[bytes],
                 gen: Iterator[int], head: Chunk) -> None:
        self.llm, self.req, self.tokens, self.limit, self.stops, self.gen, self.head = \
            llm, req, tokens, limit, stops, gen, head
        self.detok = functools.partial(llm.detokenize, special=req.special)
        self.out: list[int] = []
        self.sent = 0  # completion tokens streamed so far
        self.prompt_len = len(req.prompt)

    def chunk(self, text: str, logprobs: Any = None, finish: str | None = None) -> Chunk:
        return self.head | {"choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}

    def top(self, row: np.ndarray, token: int, token_str: str) -> tuple[float, dict[str, float]]:
        lp = logits_to_logprobs(row)
        order = np.lexsort((-np.arange(len(lp)), -lp))[:self.req.logprobs]  # by logprob, then the larger id
        top = {self.detok([int(i)]).decode("utf-8", "ignore"): float(lp[i]) for i in order}
        top[token_str] = float(lp[token])
        return float(lp[token]), top

    def token_entry(self, token: int, offset: int) -> dict[str, Any]:
        token_str = self.detok([token]).decode("utf-8", "ignore")
        lp, top = self.top(self.llm._scores[len(self.tokens) + self.sent - 1], token, token_str)
        return {"tokens": [token_str], "text_offset": [offset], "token_logprobs": [lp], "top_logprobs": [top]}

    def chunks(self) -> Iterator[Chunk]:
        llm, detok, stream = self.llm, self.detok, self.req.stream
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
        detok = self.detok
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
        detok = self.detok
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
        req, llm, detok = self.req, self.llm, self.detok
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
