"""`Llama`: the high-level API of llama-cpp-python (completions and chat completions as OpenAI-shaped dicts
or streamed chunks), over the package's Model and Context, with the longhaul load mode as a parameter.

Code written for llama-cpp-python switches by changing the import and adding the load mode:

    from longhaul_cpp import Llama
    llm = Llama("model.gguf", n_ctx=4096, load_mode="longhaul", longhaul_cache="auto")
    llm.create_chat_completion([{"role": "user", "content": "Hi"}])["choices"][0]["message"]["content"]
"""
from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ._lib import ffi, logger
from .context import Context
from .longhaul import LonghaulStats, is_auto_budget
from .model import LoadMode, Model
from .sampling import DEFAULT_SEED, Sampler, SamplingParams, apply_chat_template, model_chat_template
from .textstream import TextStream

_CONTEXT_FIELDS = {name for name, _ in ffi.typeof("struct llama_context_params").fields}


def _load_mode(value: LoadMode | str | int) -> LoadMode:
    if isinstance(value, str):
        try:
            return LoadMode[value.strip().upper().replace("+", "_")]
        except KeyError:
            raise ValueError(f"unknown load_mode '{value}': use one of "
                             f"{', '.join(m.name.lower() for m in LoadMode)}") from None
    return LoadMode(value)


class Llama:
    """A model and one context, answering completions and chat completions like llama-cpp-python's `Llama`.

    `load_mode` ("longhaul", "mmap", ... or a LoadMode) and `longhaul_cache` ("2GiB", 2, "auto") choose how
    the model is loaded; other keyword arguments are `llama_model_params` or `llama_context_params`
    fields. `chat_format`: None uses the model's own template (tokenizer.chat_template), or a built-in
    template name ("chatml", "llama3", ...). Sampling runs in the library's sampler chain.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = 512, n_batch: int = 512,
                 n_ubatch: int | None = None, n_threads: int | None = None, n_threads_batch: int | None = None,
                 seed: int = DEFAULT_SEED, load_mode: LoadMode | str = LoadMode.AUTO,
                 longhaul_cache: float | int | str | None = None, n_gpu_layers: int = 0,
                 chat_format: str | None = None, verbose: bool = False, **params: Any) -> None:
        if verbose and not logger.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(h)
            logger.setLevel(logging.INFO)
        ctx_params = {k: params.pop(k) for k in list(params) if k in _CONTEXT_FIELDS}
        ctx_params.update(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch or min(n_batch, 512))
        if n_threads:
            ctx_params["n_threads"] = n_threads
        if n_threads_batch:
            ctx_params["n_threads_batch"] = n_threads_batch
        SamplingParams(seed=seed)  # checks the seed
        self.seed = seed
        self.model_path = str(model_path)
        mode = _load_mode(load_mode)
        auto = is_auto_budget(longhaul_cache)
        self.model = Model(model_path, load_mode=mode, longhaul_cache=longhaul_cache, n_gpu_layers=n_gpu_layers,
                           context_params=dict(ctx_params) if auto else None, **params)
        try:
            self.ctx: Context = self.model.context(**ctx_params)
        except BaseException:
            self.model.close()
            raise
        if self.model.is_longhaul:
            logger.info("%s", self.model.longhaul_plan(ctx_params["n_ubatch"]))
        self.chat_format = chat_format
        self._template = chat_format or model_chat_template(self.model)

    # -- lifetime --
    def close(self) -> None:
        self.model.close()  # closes the context too

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- vocabulary --
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text` (bytes are UTF-8), with BOS when the model adds one and `add_bos`."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return [int(t) for t in self.model.tokenize(text, add_special=add_bos, parse_special=special)]

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of the tokens' pieces (as llama-cpp-python returns them)."""
        return b"".join(self.model.token_to_piece(int(t)) for t in tokens)

    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def longhaul_stats(self) -> LonghaulStats:
        return self.model.longhaul_stats()

    # -- completions --
    def __call__(self, prompt: str | Sequence[int], **kw: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        return self.create_completion(prompt, **kw)

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, repeat_penalty: float = 1.0,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0, seed: int | None = None,
                          stop: str | Sequence[str] | None = None, stream: bool = False, echo: bool = False,
                          logprobs: int | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """An OpenAI `text_completion` dict, or with stream=True an iterator of its chunks."""
        if logprobs is not None and (isinstance(logprobs, bool) or not 0 <= logprobs <= 20):
            raise ValueError(f"logprobs must be None or an integer from 0 to 20, got {logprobs!r}")
        tokens = self._prompt_tokens(prompt)
        run = self._run(tokens, max_tokens, stream, self._sampling(
            temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty, seed), stop, logprobs)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_path}
        prefix = (prompt if isinstance(prompt, str) else self.detokenize(prompt).decode("utf-8", "replace")) if echo else ""
        if stream:
            return self._completion_chunks(head, run, prefix)
        text = prefix + "".join(piece for piece, _ in run)
        return head | {"choices": [{"text": text, "index": 0, "logprobs": run.logprobs_dict(prefix),
                                    "finish_reason": run.finish_reason}], "usage": run.usage()}

    def _completion_chunks(self, head: dict[str, Any], run: _Run, prefix: str) -> Iterator[dict[str, Any]]:
        if prefix:
            yield head | {"choices": [{"text": prefix, "index": 0, "logprobs": None, "finish_reason": None}]}
        for piece, lp in run:
            yield head | {"choices": [{"text": piece, "index": 0, "logprobs": lp, "finish_reason": None}]}
        yield head | {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": run.finish_reason}],
                      "usage": run.usage()}

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                               presence_penalty: float = 0.0, seed: int | None = None,
                               stop: str | Sequence[str] | None = None, stream: bool = False, logprobs: bool = False,
                               top_logprobs: int | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """An OpenAI `chat.completion` dict, or with stream=True an iterator of `chat.completion.chunk`s. The
        prompt is the chat template's rendering of `messages`, with the assistant's turn opened."""
        if not self._template:
            raise ValueError("the model has no chat template (tokenizer.chat_template): pass chat_format=, e.g. "
                             "Llama(..., chat_format='chatml')")
        if isinstance(messages, (str, bytes)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        prompt = apply_chat_template(self._template, messages)
        n_top = (top_logprobs or 0) if logprobs else None
        run = self._run(self._prompt_tokens(prompt, special=True), max_tokens, stream, self._sampling(
            temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty, seed), stop, n_top)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": self.model_path}
        if stream:
            return self._chat_chunks(head, run)
        text = "".join(piece for piece, _ in run)
        return head | {"object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "logprobs": run.chat_logprobs() if logprobs else None,
                                    "finish_reason": run.finish_reason}],
                       "usage": run.usage()}

    def _chat_chunks(self, head: dict[str, Any], run: _Run) -> Iterator[dict[str, Any]]:
        chunk = head | {"object": "chat.completion.chunk"}
        yield chunk | {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]}
        for piece, _ in run:
            yield chunk | {"choices": [{"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}]}
        yield chunk | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": run.finish_reason}],
                       "usage": run.usage()}

    # -- internals --
    def _sampling(self, temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                  frequency_penalty: float, presence_penalty: float, seed: int | None) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, seed=self.seed if seed is None else seed)

    def _prompt_tokens(self, prompt: str | Sequence[int], special: bool = True) -> list[int]:
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_bos=True, special=special)
        elif isinstance(prompt, (bytes, bytearray)):
            raise ValueError("prompt must be a str or a list of token ids, not bytes")
        else:
            tokens = [int(t) for t in prompt]
            bad = [t for t in tokens if not 0 <= t < self.model.n_vocab]
            if bad:
                raise ValueError(f"prompt token ids out of range [0, {self.model.n_vocab}): {bad[:5]}")
        if not tokens:
            raise ValueError("the prompt is empty (no tokens)")
        if len(tokens) >= self.ctx.n_ctx:
            raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {self.ctx.n_ctx}")
        return tokens

    def _run(self, tokens: list[int], max_tokens: int | None, stream: bool, sampling: SamplingParams,
             stop: str | Sequence[str] | None, n_logprobs: int | None) -> _Run:
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise ValueError(f"max_tokens must be an integer or None, got {max_tokens!r}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) for s in stops):
            raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
        budget = self.ctx.n_ctx - len(tokens)
        limit = budget if max_tokens is None or max_tokens <= 0 else min(max_tokens, budget)
        return _Run(self, tokens, limit, Sampler(self.model, sampling), [s for s in stops if s], n_logprobs, stream)


class _Run:
    """One generation: iterating yields (text piece, logprobs of its tokens or None) as the text becomes
    final (whole UTF-8 characters, never part of a stop string); finish_reason and the counts after."""

    def __init__(self, llm: Llama, tokens: list[int], limit: int, sampler: Sampler, stops: list[str],
                 n_logprobs: int | None, stream: bool) -> None:
        self.llm, self.tokens, self.limit, self.sampler = llm, tokens, limit, sampler
        self.stream = stream
        self.n_logprobs = n_logprobs
        self.text = TextStream(stops)
        self.finish_reason: str | None = None
        self.n_completion = 0
        self.token_logprobs: list[tuple[str, float, dict[str, float]]] = []
        self._pending_lp: list[tuple[str, float, dict[str, float]]] = []
        self._it = self._generate()

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._it

    def _generate(self) -> Iterator[tuple[str, Any]]:
        ctx, model = self.llm.ctx, self.llm.model
        try:
            ctx.reset()
            ctx.decode(self.tokens)
            self.finish_reason = "length"
            while self.n_completion < self.limit:
                tok = self.sampler.sample(ctx)
                self.n_completion += 1
                if model.is_eog(tok):
                    self.finish_reason = "stop"
                    break
                if self.n_logprobs is not None:
                    self._record_logprobs(tok)
                piece, stopped = self.text.push(model.token_to_piece(tok))
                if piece:
                    yield piece, self._take_logprobs()
                if stopped:
                    self.finish_reason = "stop"
                    break
                if self.n_completion < self.limit:
                    ctx.decode([tok])
            tail = self.text.flush(incomplete=not self.stream)
            if tail:
                yield tail, self._take_logprobs()
        finally:
            self.sampler.close()

    def _record_logprobs(self, tok: int) -> None:
        z = self.llm.ctx.logits().astype(np.float64)
        lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
        top = np.argsort(-lp, kind="stable")[:self.n_logprobs]
        piece = self.llm.model.token_to_piece
        tops: dict[str, float] = {}
        for t in top:  # byte tokens can share a text (U+FFFD): the likelier one keeps it
            tops.setdefault(piece(int(t)).decode("utf-8", "replace"), float(lp[t]))
        entry = (piece(tok).decode("utf-8", "replace"), float(lp[tok]), tops)
        self.token_logprobs.append(entry)
        self._pending_lp.append(entry)

    def _take_logprobs(self) -> dict[str, Any] | None:
        if self.n_logprobs is None:
            return None
        taken, self._pending_lp = self._pending_lp, []
        return {"tokens": [t for t, _, _ in taken], "token_logprobs": [p for _, p, _ in taken],
                "top_logprobs": [top for _, _, top in taken], "text_offset": []}

    def logprobs_dict(self, prefix: str) -> dict[str, Any] | None:
        if self.n_logprobs is None:
            return None
        offsets, pos = [], len(prefix)
        for tok, _, _ in self.token_logprobs:
            offsets.append(pos)
            pos += len(tok)
        return {"tokens": [t for t, _, _ in self.token_logprobs],
                "token_logprobs": [p for _, p, _ in self.token_logprobs],
                "top_logprobs": [top for _, _, top in self.token_logprobs], "text_offset": offsets}

    def chat_logprobs(self) -> dict[str, Any]:
        return {"content": [{"token": t, "logprob": p, "bytes": list(t.encode()),
                             "top_logprobs": [{"token": k, "logprob": v, "bytes": list(k.encode())} for k, v in top.items()]}
                            for t, p, top in self.token_logprobs]}

    def usage(self) -> dict[str, int]:
        n_prompt = len(self.tokens)
        return {"prompt_tokens": n_prompt, "completion_tokens": self.n_completion,
                "total_tokens": n_prompt + self.n_completion}
