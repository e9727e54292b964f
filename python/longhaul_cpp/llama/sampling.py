"""The library's sampler chain, in llama-cpp-python's order, as the high-level API (`Llama`) uses it."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .._lib import Handle, LlamaError, ffi, lib

if TYPE_CHECKING:
    from ..context import Context
    from ..model import Model

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed

# `llama_token_data` as a numpy record: the candidates handed to the chain
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

LogitsHook = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler, with llama-cpp-python's defaults and meanings: temperature 0 is
    greedy, below 0 a plain draw from the distribution; top_p, typical_p >= 1 and top_k <= 0 are off;
    mirostat_mode 1 or 2 replaces top-k/typical/top-p/min-p. Checked on creation (ValueError naming the
    argument): numbers must be finite, repeat_penalty above 0."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{f.name}={value!r} is out of range: a finite number is needed")
        for name in ("top_k", "penalty_last_n", "mirostat_mode", "seed"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty={self.repeat_penalty!r} is out of range: above 0 (1 is off)")
        if self.penalty_last_n < -1:
            raise ValueError(f"penalty_last_n={self.penalty_last_n!r} is out of range: -1 (the context), 0 or more")
        if self.mirostat_mode not in (0, 1, 2):
            raise ValueError(f"mirostat_mode={self.mirostat_mode!r} is out of range: 0 (off), 1 or 2")


class Sampler(Handle):
    """A `llama_sampler` chain as llama-cpp-python builds it: the logits processors (on the raw logits),
    repetition penalties, the grammar, then greedy (temperature 0), a plain draw (below 0), mirostat, or
    top-k, typical, top-p, min-p, temperature and a seeded draw."""

    _what = "sampler"

    def __init__(self, model: Model, params: SamplingParams, *, grammar: str | None = None,
                 logits_processor: LogitsHook | None = None) -> None:
        self._ptr = ffi.NULL
        self.model = model
        self.logits_processor = logits_processor
        self._cand = np.empty(model.n_vocab, TOKEN_DATA)  # the candidates, refilled for every token
        self._ids = np.arange(model.n_vocab, dtype=np.int32)
        L = lib()
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._ptr = chain
        seed = params.seed & 0xFFFFFFFF
        add = lambda s: L.llama_sampler_chain_add(chain, s)  # noqa: E731
        add(L.llama_sampler_init_penalties(model.n_vocab, params.penalty_last_n, params.repeat_penalty,
                                           params.frequency_penalty, params.presence_penalty))
        if grammar is not None:
            g = L.llama_sampler_init_grammar(model._vocab, grammar.encode(), b"root")
            if g == ffi.NULL:
                raise LlamaError("the grammar does not parse (the library's log says where): check its GBNF")
            add(g)
        t = params.temperature
        if t < 0:
            add(L.llama_sampler_init_dist(seed))
        elif t == 0:
            add(L.llama_sampler_init_greedy())
        elif params.mirostat_mode == 1:
            add(L.llama_sampler_init_mirostat(model.n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100))
        elif params.mirostat_mode == 2:
            add(L.llama_sampler_init_mirostat_v2(seed, params.mirostat_tau, params.mirostat_eta))
        else:
            add(L.llama_sampler_init_top_k(params.top_k))
            add(L.llama_sampler_init_typical(params.typical_p, 1))
            add(L.llama_sampler_init_top_p(params.top_p, 1))
            add(L.llama_sampler_init_min_p(params.min_p, 1))
            add(L.llama_sampler_init_temp(t))
            add(L.llama_sampler_init_dist(seed))

    def sample(self, ctx: Context, input_ids: np.ndarray | None = None) -> int:
        """The next token from the last decoded token's logits, after the logits processors (which see
        `input_ids`, the tokens evaluated so far); the chain records it as accepted."""
        logits = ctx.logits()
        if self.logits_processor is not None:
            ids = np.zeros(0, np.intc) if input_ids is None else input_ids
            logits = np.asarray(self.logits_processor(ids, logits.copy()), dtype=np.float32)
            if logits.shape != (self.model.n_vocab,):
                raise ValueError(f"a logits processor returned shape {logits.shape}, not ({self.model.n_vocab},)")
        cand = self._cand  # the chain may reorder it: the ids are written again
        cand["id"] = self._ids
        cand["logit"] = logits
        cand["p"] = 0
        cur = ffi.new("llama_token_data_array *")
        cur.data = ffi.cast("llama_token_data *", ffi.from_buffer(cand))
        cur.size, cur.selected, cur.sorted = len(cand), -1, False
        L = lib()
        L.llama_sampler_apply(self.ptr, cur)
        if not 0 <= cur.selected < cur.size:
            raise LlamaError("the sampler chain selected no token (a grammar that allows nothing more?)")
        token = int(cur.data[cur.selected].id)
        L.llama_sampler_accept(self.ptr, token)
        return token

    def close(self) -> None:
        if self._ptr != ffi.NULL:
            lib().llama_sampler_free(self._ptr)
            self._ptr = ffi.NULL
