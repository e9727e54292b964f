"""Model: loading a GGUF model in a load mode (longhaul among them), its vocabulary and cache statistics."""
from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._lib import Handle, LlamaError, ffi, lib, log_mark, logger, raise_error
from .context import Context
from .fit import CacheFit, fit_budget
from .longhaul import (LayerStats, LonghaulStats, is_auto_budget, load_split, parse_cache_size, python_budget_advice,
                       size_arg)
from .modelinfo import inspect_model
from .params import LoadMode, LonghaulFlag, buft_overrides, set_fields
from .params import context_params as context_params_struct


class Model(Handle):
    """A GGUF model loaded by libllama.

    Keyword arguments are fields of `llama_model_params` (n_gpu_layers, load_mode, use_extra_bufts,
    longhaul_flags=LonghaulFlag.PIPELINE | ..., longhaul_io_threads, ...). `longhaul_cache` is the expert
    cache budget of LoadMode.LONGHAUL: GiB as a number, a string with a unit ("2GiB", "512MiB"), or
    "auto": the largest that fits in the memory available next to a context with
    `context_params` (Model.context()'s defaults when None); `longhaul_fit` then holds
    the choice and its breakdown (CacheFit). `longhaul_cache_bytes=N` (the C field) takes an exact
    number of bytes instead.
    `longhaul_layer_slots`: the expert slots of each layer instead of the budget's even split: {layer: slots}
    (plan.policies.split_budget makes one from a recorded run), one entry per layer (0 where a layer has no
    routed experts), or the path of a file `longhaul-cpp plan --write-split` wrote; their bytes must fit in the
    budget. `longhaul_flags=LonghaulFlag.LFU`: replacement by use counts with aging instead of LRU.
    `tensor_buft_overrides` also takes a dict `{tensor name regex: buffer type name}`,
    like `-ot`: `{"ffn_.*_exps": "CPU"}` keeps the expert banks in the plain CPU layout.
    Split models load from the first shard's path.
    Use as a context manager, or call close(), to free it deterministically.
    """

    _what = "model"

    def __init__(self, path: str | os.PathLike[str], *, load_mode: LoadMode = LoadMode.AUTO,
                 longhaul_cache: float | int | str | None = None, n_gpu_layers: int = 0,
                 context_params: Mapping[str, Any] | None = None, **params: Any) -> None:
        self._ptr = ffi.NULL
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()  # closed with the model
        self.path = Path(path)
        self.longhaul_fit: CacheFit | None = None  # what longhaul_cache="auto" chose
        load_mode = LoadMode(load_mode)
        auto = is_auto_budget(longhaul_cache)
        exact = params.get("longhaul_cache_bytes")
        if load_mode == LoadMode.LONGHAUL:
            if (longhaul_cache is None) == (exact is None):
                raise ValueError("give the expert cache budget of LoadMode.LONGHAUL once: longhaul_cache=2 (GiB), "
                                 "longhaul_cache='512MiB' or longhaul_cache='auto', or longhaul_cache_bytes=N")
            if exact is not None and (isinstance(exact, bool) or not isinstance(exact, int) or not 0 < exact < 2**63):
                raise ValueError(f"longhaul_cache_bytes must be a number of bytes above 0 and below 2^63, got {exact!r}")
            if longhaul_cache is not None and not auto:
                params["longhaul_cache_bytes"] = parse_cache_size(longhaul_cache)
        elif longhaul_cache is not None or exact is not None:
            raise ValueError("longhaul_cache is only used with load_mode=LoadMode.LONGHAUL")
        if context_params is not None and not auto:
            raise ValueError("context_params (the context longhaul_cache='auto' leaves room for) is only used with "
                             "longhaul_cache='auto'")
        if not self.path.is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        keep: list[Any] = []  # buffers the params point into, alive until the load returns
        if isinstance(params.get("tensor_buft_overrides"), Mapping):
            params["tensor_buft_overrides"], keep = buft_overrides(params["tensor_buft_overrides"])
        slots = params.pop("longhaul_layer_slots", None)
        if slots is not None:
            if load_mode != LoadMode.LONGHAUL:
                raise ValueError("longhaul_layer_slots is only used with load_mode=LoadMode.LONGHAUL")
            if auto:  # as common refuses --longhaul-split with --longhaul-cache auto
                raise ValueError("longhaul_layer_slots fixes the slots of every layer, so longhaul_cache='auto' has "
                                 "nothing to choose: give the budget the split was planned for (e.g. longhaul_cache=2 "
                                 "or longhaul_cache_bytes=N)")
            if isinstance(slots, (str, os.PathLike)):
                slots = load_split(slots)
            if isinstance(slots, Mapping):
                by_layer = [0] * inspect_model(self.path).n_layer
                for il, n in slots.items():
                    if not 0 <= int(il) < len(by_layer):
                        raise ValueError(f"longhaul_layer_slots names layer {il}; the model has {len(by_layer)}")
                    by_layer[int(il)] = int(n)
                slots = by_layer
            arr = ffi.new("int32_t[]", [int(n) for n in slots])
            keep.append(arr)
            params.update(longhaul_layer_slots=arr, longhaul_n_layer_slots=len(arr))
        L = lib()
        p = L.llama_model_default_params()
        set_fields(p, "struct llama_model_params", {"load_mode": load_mode, "n_gpu_layers": n_gpu_layers, **params})
        if auto:
            f = self.longhaul_fit = fit_budget(self.path, p, context_params_struct(**(context_params or {})))
            p.longhaul_cache_bytes = f.budget
            logger.info("longhaul: longhaul_cache='auto' chose %s (%d of %d experts per layer at least): %s available "
                        "- resident weights %s - KV cache %s - compute %s - read buffers %s - headroom %s",
                        *(size_arg(b) for b in (f.budget,)), f.n_slots, f.n_expert,
                        *(size_arg(b) for b in (f.available, f.resident, f.context, f.compute, f.io, f.headroom)))
        self.longhaul_budget = int(p.longhaul_cache_bytes) if load_mode == LoadMode.LONGHAUL else 0
        mark = log_mark()
        ptr = L.llama_model_load_from_file(os.fsencode(self.path), p)
        del keep  # the loader copied what it needs
        if ptr == ffi.NULL:
            raise_error(f"failed to load model {self.path}", mark, python_budget_advice)
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

    def meta(self, key: str, *, limit: int = 1024) -> str | None:
        """The metadata value of `key` as text (None when absent), read whole up to `limit` bytes."""
        size = 1024
        while True:
            buf = ffi.new("char[]", size)
            n = lib().llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size or size >= limit:
                return ffi.string(buf).decode("utf-8", "replace")
            size = min(n + 1, limit)

    def meta_keys(self) -> list[str]:
        L = lib()
        buf = ffi.new("char[]", 512)
        keys = []
        for i in range(L.llama_model_meta_count(self.ptr)):
            L.llama_model_meta_key_by_index(self.ptr, i, buf, 512)
            keys.append(ffi.string(buf).decode("utf-8", "replace"))
        return keys

    def desc(self) -> str:
        buf = ffi.new("char[]", 256)
        lib().llama_model_desc(self.ptr, buf, 256)
        return ffi.string(buf).decode()

    # -- longhaul --
    @property
    def is_longhaul(self) -> bool:
        return lib().llama_model_longhaul_n_layers(self.ptr) > 0

    @property
    def longhaul_flags(self) -> LonghaulFlag:
        """The longhaul switches in effect: the ones asked for, with the library's choices of direct I/O and
        pipelined waves filled in (one of each pair); 0 when not loaded in longhaul mode."""
        return LonghaulFlag(int(lib().llama_model_longhaul_flags(self.ptr)))

    def longhaul_stats(self) -> LonghaulStats:
        """Counters of the longhaul expert cache (totals and per routed MoE layer)."""
        L = lib()
        n = L.llama_model_longhaul_n_layers(self.ptr)
        if n == 0:
            raise LlamaError("the model is not loaded in longhaul mode (load_mode=LoadMode.LONGHAUL)")
        s = ffi.new("struct llama_longhaul_stats *")

        def read(i: int) -> LayerStats:
            if not L.llama_model_longhaul_stats(self.ptr, i, s, ffi.sizeof(s[0])):
                raise LlamaError(f"llama_model_longhaul_stats failed for layer index {i} of {n}")
            return LayerStats.from_c(s)

        return LonghaulStats(total=read(-1), layers=[read(i) for i in range(n)])

    def longhaul_plan(self, n_ubatch: int) -> str:
        """One line: the budget, the slots per routed layer and how a prompt ubatch of n_ubatch runs (one pass,
        expert waves, or one token at a time in stages); "" when not in longhaul mode."""
        if not self.is_longhaul:
            return ""
        slots = [layer.n_slots for layer in self.longhaul_stats().layers]
        lo, hi = min(slots), max(slots)
        cached = self.longhaul_stats().total.cache_bytes
        return (f"longhaul: budget {size_arg(self.longhaul_budget)}, {lo if lo == hi else f'{lo}-{hi}'} slots per layer "
                f"in {len(slots)} routed MoE layers ({size_arg(cached)} of slots); prompts: "
                f"{inspect_model(self.path).prompt_plan(self.longhaul_budget, n_ubatch)}")

    def longhaul_error(self) -> str:
        """Why the last decode on this model failed in longhaul mode (a failed expert read), or ""."""
        n = lib().llama_model_longhaul_error(self.ptr, ffi.NULL, 0)
        if n <= 0:
            return ""
        buf = ffi.new("char[]", n + 1)  # a copy: another context's decode may replace the message meanwhile
        lib().llama_model_longhaul_error(self.ptr, buf, n + 1)
        return ffi.string(buf).decode("utf-8", "replace")

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

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        L = lib()
        buf = ffi.new("char[]", 64)
        n = L.llama_token_to_piece(self._vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = L.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, special)
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

    def token_bos(self) -> int:
        return int(lib().llama_vocab_bos(self._vocab))

    def token_eos(self) -> int:
        return int(lib().llama_vocab_eos(self._vocab))

    def token_get_text(self, token: int) -> str:
        return ffi.string(lib().llama_vocab_get_text(self._vocab, int(token))).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(lib().llama_vocab_is_eog(self._vocab, int(token)))

    # -- contexts --
    def context(self, **params: Any) -> Context:
        """A new context; keyword arguments are fields of `llama_context_params` (n_ctx, n_ubatch, ...), and
        `routing=RoutingRecorder()` to record the routed expert ids."""
        ctx = Context(self, **params)
        self._contexts.add(ctx)
        return ctx
