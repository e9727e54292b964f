"""Context: decode batches, read logits as numpy arrays, generate text."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ._lib import Handle, LlamaError, ffi, lib, log_mark, raise_error
from .longhaul import python_budget_advice
from .params import context_params
from .routing import RoutingRecorder



class ContextModel(Protocol):
    """What a context uses of its model (a `Model`): named here so that this module does not import model.py,
    which imports this one to make contexts."""

    @property
    def ptr(self) -> Any: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def is_longhaul(self) -> bool: ...
    def longhaul_error(self) -> str: ...
    def is_eog(self, token: int) -> bool: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray: ...
    def token_to_piece(self, token: int, *, special: bool = False) -> bytes: ...
    def detokenize(self, tokens: Sequence[int] | np.ndarray) -> str: ...
    def context(self, **params: Any) -> Context: ...


class Context(Handle):
    """A llama_context: decode batches, read logits, generate."""

    _what = "context"

    def __init__(self, model: ContextModel, *, routing: RoutingRecorder | None = None, **params: Any) -> None:
        """`routing`: a RoutingRecorder that reads the routed expert ids through this context's eval callback."""
        self._ptr = ffi.NULL
        self.model = model
        self.routing = routing  # keeps its callback alive as long as the context
        L = lib()
        p = context_params(**params)
        if routing is not None:
            p.cb_eval = routing.callback
        mark = log_mark()
        ptr = L.llama_init_from_model(model.ptr, p)
        if ptr == ffi.NULL:
            raise_error("failed to create the context", mark, python_budget_advice)
        self._ptr = ptr
        self.n_past = 0
        self._n_outputs = 0

    def close(self) -> None:
        if self._ptr != ffi.NULL:
            lib().llama_free(self._ptr)
            self._ptr = ffi.NULL

    @property
    def n_ctx(self) -> int:
        return int(lib().llama_n_ctx(self.ptr))

    @property
    def n_batch(self) -> int:
        return int(lib().llama_n_batch(self.ptr))

    @property
    def n_ubatch(self) -> int:
        """The effective physical batch size."""
        return int(lib().llama_n_ubatch(self.ptr))

    def reset(self) -> None:
        """Clear the memory (KV cache); the next decode starts at position 0."""
        lib().llama_memory_clear(lib().llama_get_memory(self.ptr), True)
        self.n_past = 0
        self._n_outputs = 0

    def state_get(self) -> bytes:
        """The context's memory (KV cache and recurrent state) and position, as bytes. Logits are not
        part of it: after state_set(), decode the next token before reading logits."""
        size = lib().llama_state_get_size(self.ptr)
        buf = ffi.new("uint8_t[]", size)
        n = lib().llama_state_get_data(self.ptr, buf, size)
        if n != size:
            raise LlamaError(f"llama_state_get_data wrote {n} of {size} bytes")
        return bytes(ffi.buffer(buf, size)) + self.n_past.to_bytes(8, "little")

    def state_set(self, state: bytes) -> None:
        """Restore a state from state_get() (same model and context parameters)."""
        data = state[:-8]
        n = lib().llama_state_set_data(self.ptr, data, len(data))
        if n != len(data):
            raise LlamaError(f"llama_state_set_data: the state does not fit this context (read {n} of {len(data)} bytes)")
        self.n_past = int.from_bytes(state[-8:], "little")
        self._n_outputs = 0  # no logits until the next decode

    def decode(self, tokens: Sequence[int] | np.ndarray, *, all_logits: bool = False) -> None:
        """Append tokens at the current position; logits of the last (or every) token become readable."""
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        if toks.size == 0:
            raise ValueError("decode needs at least one token")
        L = lib()
        n_batch = self.n_batch
        for start in range(0, len(toks), n_batch):
            chunk = toks[start:start + n_batch]
            last_chunk = start + n_batch >= len(toks)
            batch = L.llama_batch_init(len(chunk), 0, 1)
            try:
                batch.n_tokens = len(chunk)
                for i, t in enumerate(chunk):
                    batch.token[i] = int(t)
                    batch.pos[i] = self.n_past + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1 if (all_logits and last_chunk) or (last_chunk and i == len(chunk) - 1) else 0
                mark = log_mark()
                rc = L.llama_decode(self.ptr, batch)
            finally:
                L.llama_batch_free(batch)
            if rc != 0:
                why = self.model.longhaul_error() if self.model.is_longhaul else ""
                if why:  # a failed expert read: the file, the offset and what to do
                    raise LlamaError(f"llama_decode failed with code {rc} at position {self.n_past}: {why}")
                raise_error(f"llama_decode failed with code {rc} at position {self.n_past}", mark)
            self.n_past += len(chunk)
            self._n_outputs = len(chunk) if all_logits else 1

    def logits(self, i: int = -1) -> np.ndarray:
        """Logits of token `i` of the last decoded batch (negative: counted from the last output).

        A float32 view of the library's buffer, valid until the next decode; copy it to keep it.
        """
        if self._n_outputs == 0:
            raise LlamaError("no logits: decode something first")
        mark = log_mark()
        ptr = lib().llama_get_logits_ith(self.ptr, int(i))
        if ptr == ffi.NULL:
            raise_error(f"no logits for token {i} of the last batch", mark)
        n = self.model.n_vocab
        return np.frombuffer(ffi.buffer(ptr, n * 4), dtype=np.float32)

    def greedy(self, prompt: Sequence[int] | np.ndarray, n_predict: int, *, stop_at_eog: bool = True) -> Iterator[int]:
        """Decode `prompt` (if any), then yield up to `n_predict` greedily chosen token ids."""
        if len(prompt):
            self.decode(prompt)
        for _ in range(n_predict):
            tok = int(np.argmax(self.logits()))
            if stop_at_eog and self.model.is_eog(tok):
                return
            yield tok
            self.decode([tok])

    def generate(self, prompt: str, max_tokens: int = 64, temperature: float = 0.0, seed: int | None = 0,
                 *, stream: bool = False) -> str | Iterator[str]:
        """Generate text after `prompt` in this context (appending to what it holds).

        temperature 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature)
        with a numpy generator seeded by `seed` (reproducible). Stops at an end-of-generation
        token. Returns the text, or with stream=True an iterator of text pieces as they decode
        (UTF-8 sequences split across byte tokens come out whole).
        """
        if max_tokens < 0 or temperature < 0:
            raise ValueError("max_tokens and temperature must not be negative")
        pieces = self._generate(prompt, max_tokens, temperature, seed)
        return pieces if stream else "".join(pieces)

    def _generate(self, prompt: str, max_tokens: int, temperature: float, seed: int | None) -> Iterator[str]:
        import codecs

        rng = np.random.default_rng(seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decode(self.model.tokenize(prompt, add_special=self.n_past == 0))
        for _ in range(max_tokens):
            logits = self.logits()
            if temperature == 0:
                tok = int(np.argmax(logits))
            else:
                z = logits.astype(np.float64) / temperature
                p = np.exp(z - z.max())
                tok = int(rng.choice(len(p), p=p / p.sum()))
            if self.model.is_eog(tok):
                break
            self.decode([tok])
            text = decoder.decode(self.model.token_to_piece(tok))
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def perf(self) -> dict[str, float]:
        d = lib().llama_perf_context(self.ptr)
        return {f: getattr(d, f) for f, _ in ffi.typeof("struct llama_perf_context_data").fields}


def greedy_generate(model: ContextModel, prompt: str, n_predict: int, **ctx_params: Any) -> tuple[list[int], str]:
    """Tokenize `prompt`, generate `n_predict` tokens greedily in a fresh context; return (ids, text)."""
    with model.context(**ctx_params) as ctx:
        ids = list(ctx.greedy(model.tokenize(prompt), n_predict))
    return ids, model.detokenize(ids)
