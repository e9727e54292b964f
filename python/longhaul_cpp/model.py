"""Model and Context: the load-mode API over libllama."""
from __future__ import annotations

import enum
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._lib import LlamaError, ffi, lib, log_mark, raise_error
from .longhaul import LayerStats, LonghaulStats, parse_cache_size


# `enum llama_load_mode` of the binding (AUTO, NONE, MMAP, MLOCK, MMAP_MLOCK, DIRECT_IO, LONGHAUL)
LoadMode = enum.IntEnum("LoadMode", {name[len("LLAMA_LOAD_MODE_"):]: value for value, name in
                                     sorted(ffi.typeof("enum llama_load_mode").elements.items())})
LoadMode.__doc__ = "Mirrors `enum llama_load_mode` (taken from the binding's declaration)."


def _set_fields(struct: Any, kind: str, values: dict[str, Any]) -> None:
    fields = {name for name, _ in ffi.typeof(kind).fields}
    for key, value in values.items():
        if key not in fields:
            raise TypeError(f"unknown {kind.split()[-1]} field '{key}'; known: {', '.join(sorted(fields))}")
        if isinstance(value, enum.Enum):
            value = value.value
        setattr(struct, key, value)


def _buft_overrides(overrides: Mapping[str, str]) -> tuple[Any, list[Any]]:
    """`{tensor name regex: buffer type name}` as a NULL-terminated `llama_model_tensor_buft_override`
    array (like `-ot PATTERN=BUFT`); returns the array and the buffers it points into."""
    L = lib()
    bufts = {}
    for i in range(L.ggml_backend_dev_count()):
        buft = L.ggml_backend_dev_buffer_type(L.ggml_backend_dev_get(i))
        bufts[ffi.string(L.ggml_backend_buft_name(buft)).decode()] = buft
    arr = ffi.new("struct llama_model_tensor_buft_override[]", len(overrides) + 1)
    keep = []
    for i, (pattern, name) in enumerate(overrides.items()):
        if name not in bufts:
            raise ValueError(f"unknown buffer type '{name}' for tensor pattern '{pattern}'; "
                             f"available: {', '.join(sorted(bufts))}")
        keep.append(ffi.new("char[]", pattern.encode()))
        arr[i].pattern = keep[-1]
        arr[i].buft = bufts[name]
    return arr, keep


class Model:
    """A GGUF model loaded by libllama.

    Keyword arguments are fields of `llama_model_params` (n_gpu_layers, load_mode,
    use_extra_bufts, ...). `longhaul_cache` is the expert cache budget of
    LoadMode.LONGHAUL: GiB as a number, or a string with a unit ("2GiB", "512MiB").
    `tensor_buft_overrides` also takes a dict `{tensor name regex: buffer type name}`,
    like `-ot`: `{"ffn_.*_exps": "CPU"}` keeps the expert banks in the plain CPU layout.
    Split models load from the first shard's path.
    Use as a context manager, or call close(), to free it deterministically.
    """

    def __init__(self, path: str | os.PathLike[str], *, load_mode: LoadMode = LoadMode.AUTO,
                 longhaul_cache: float | int | str | None = None, n_gpu_layers: int = 0, **params: Any) -> None:
        self._ptr = ffi.NULL
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()  # closed with the model
        self.path = Path(path)
        load_mode = LoadMode(load_mode)
        if load_mode == LoadMode.LONGHAUL:
            if longhaul_cache is None:
                raise ValueError("longhaul_cache is required with LoadMode.LONGHAUL: the expert cache budget, "
                                 "e.g. longhaul_cache=2 (GiB) or longhaul_cache='512MiB'")
            params.setdefault("longhaul_cache_bytes", parse_cache_size(longhaul_cache))
        elif longhaul_cache is not None:
            raise ValueError("longhaul_cache is only used with load_mode=LoadMode.LONGHAUL")
        if not self.path.is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        keep: list[Any] = []  # buffers the params point into, alive until the load returns
        if isinstance(params.get("tensor_buft_overrides"), Mapping):
            params["tensor_buft_overrides"], keep = _buft_overrides(params["tensor_buft_overrides"])
        L = lib()
        p = L.llama_model_default_params()
        _set_fields(p, "struct llama_model_params", {"load_mode": load_mode, "n_gpu_layers": n_gpu_layers, **params})
        mark = log_mark()
        ptr = L.llama_model_load_from_file(os.fsencode(self.path), p)
        del keep  # the loader copied what it needs
        if ptr == ffi.NULL:
            raise_error(f"failed to load model {self.path}", mark)
        self._ptr = ptr
        self._vocab_ptr = L.llama_model_get_vocab(ptr)

    # -- lifetime --
    def close(self) -> None:
        """Free the model and every context still open on it (also what garbage collection does)."""
        for ctx in list(self._contexts):
            ctx.close()
        self._contexts.clear()
        if self._ptr != ffi.NULL:
            lib().llama_model_free(self._ptr)
            self._ptr = ffi.NULL

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def ptr(self) -> Any:
        if self._ptr == ffi.NULL:
            raise LlamaError("the model is closed")
        return self._ptr

    @property
    def _vocab(self) -> Any:
        self.ptr  # raises once closed: the vocabulary belongs to the model
        return self._vocab_ptr

    # -- metadata --
    @property
    def n_vocab(self) -> int:
        return int(lib().llama_vocab_n_tokens(self._vocab))

    @property
    def n_layer(self) -> int:
        return int(lib().llama_model_n_layer(self.ptr))

    @property
    def n_embd(self) -> int:
        return int(lib().llama_model_n_embd(self.ptr))

    @property
    def size(self) -> int:
        """Bytes of all weights."""
        return int(lib().llama_model_size(self.ptr))

    def meta(self, key: str) -> str | None:
        buf = ffi.new("char[]", 1024)
        n = lib().llama_model_meta_val_str(self.ptr, key.encode(), buf, 1024)
        return None if n < 0 else ffi.string(buf).decode("utf-8", "replace")

    def desc(self) -> str:
        buf = ffi.new("char[]", 256)
        lib().llama_model_desc(self.ptr, buf, 256)
        return ffi.string(buf).decode()

    # -- longhaul --
    @property
    def is_longhaul(self) -> bool:
        return lib().llama_model_longhaul_n_layers(self.ptr) > 0

    def longhaul_stats(self) -> LonghaulStats:
        """Counters of the longhaul expert cache (totals and per routed MoE layer)."""
        L = lib()
        n = L.llama_model_longhaul_n_layers(self.ptr)
        if n == 0:
            raise LlamaError("the model is not loaded in longhaul mode (load_mode=LoadMode.LONGHAUL)")
        s = ffi.new("struct llama_longhaul_stats *")

        def read(i: int) -> LayerStats:
            if not L.llama_model_longhaul_stats(self.ptr, i, s):
                raise LlamaError(f"llama_model_longhaul_stats failed for layer index {i} of {n}")
            return LayerStats.from_c(s)

        return LonghaulStats(total=read(-1), layers=[read(i) for i in range(n)])

    def longhaul_stats_reset(self) -> None:
        lib().llama_model_longhaul_stats_reset(self.ptr)

    # -- vocab --
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        data = text.encode("utf-8")
        L = lib()
        cap = len(data) + 8
        buf = ffi.new("llama_token[]", cap)
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = ffi.new("llama_token[]", cap)
            n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise LlamaError(f"tokenization failed ({n})")
        return np.frombuffer(ffi.buffer(buf, n * 4), dtype=np.int32).copy()

    def token_to_piece(self, token: int) -> bytes:
        L = lib()
        buf = ffi.new("char[]", 64)
        n = L.llama_token_to_piece(self._vocab, int(token), buf, 64, 0, False)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = L.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, False)
        return ffi.buffer(buf, n)[:]

    def detokenize(self, tokens: Sequence[int] | np.ndarray) -> str:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        L = lib()
        toks = ffi.cast("llama_token *", ffi.from_buffer(arr)) if len(arr) else ffi.NULL
        cap = max(16, len(arr) * 8)
        buf = ffi.new("char[]", cap)
        n = L.llama_detokenize(self._vocab, toks, len(arr), buf, cap, False, False)
        if n < 0:
            cap = -n
            buf = ffi.new("char[]", cap)
            n = L.llama_detokenize(self._vocab, toks, len(arr), buf, cap, False, False)
        return ffi.buffer(buf, n)[:].decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(lib().llama_vocab_is_eog(self._vocab, int(token)))

    # -- contexts --
    def context(self, **params: Any) -> Context:
        """A new context; keyword arguments are fields of `llama_context_params` (n_ctx, n_ubatch, ...)."""
        ctx = Context(self, **params)
        self._contexts.add(ctx)
        return ctx


class Context:
    """A llama_context: decode batches, read logits, generate."""

    def __init__(self, model: Model, **params: Any) -> None:
        self._ptr = ffi.NULL
        self.model = model
        L = lib()
        p = L.llama_context_default_params()
        params.setdefault("n_ctx", 512)
        params.setdefault("no_perf", False)
        threads = params.pop("n_threads", None) or min(os.cpu_count() or 1, 4)
        params.setdefault("n_threads_batch", threads)
        _set_fields(p, "struct llama_context_params", {"n_threads": threads, **params})
        mark = log_mark()
        ptr = L.llama_init_from_model(model.ptr, p)
        if ptr == ffi.NULL:
            raise_error("failed to create the context", mark)
        self._ptr = ptr
        self.n_past = 0
        self._n_outputs = 0

    def close(self) -> None:
        if self._ptr != ffi.NULL:
            lib().llama_free(self._ptr)
            self._ptr = ffi.NULL

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def ptr(self) -> Any:
        if self._ptr == ffi.NULL:
            raise LlamaError("the context is closed")
        return self._ptr

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


def greedy_generate(model: Model, prompt: str, n_predict: int, **ctx_params: Any) -> tuple[list[int], str]:
    """Tokenize `prompt`, generate `n_predict` tokens greedily in a fresh context; return (ids, text)."""
    with model.context(**ctx_params) as ctx:
        ids = list(ctx.greedy(model.tokenize(prompt), n_predict))
    return ids, model.detokenize(ids)
