"""`Llama`'s constructor arguments (llama-cpp-python 0.3.36's, with its defaults) turned into the model's and
the context's parameters, and the refusals: what longhaul mode cannot honour, by name, with the reason and
what to do instead."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

from .._lib import LlamaError, ffi, lib, logger
from ..params import LoadMode

_CONTEXT_FIELDS = {name for name, _ in ffi.typeof("struct llama_context_params").fields}
_MODEL_FIELDS = {name for name, _ in ffi.typeof("struct llama_model_params").fields}
_handler: logging.Handler | None = None
_numa_done = False


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a record arrives (not the stream of the moment it was made)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must not raise into the library's callback
            self.handleError(record)


def configure_verbose(verbose: bool) -> None:
    """verbose=True (llama-cpp-python's default) writes the library's log to stderr, verbose=False stops it:
    like llama-cpp-python's, the setting is the process's and the last Llama constructed sets it. A handler
    the application gave the "longhaul_cpp" logger itself is left alone."""
    global _handler
    if verbose and _handler is None and not logger.handlers:
        _handler = _Stderr()
        _handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(_handler)
        logger.setLevel(logging.INFO)
    elif not verbose and _handler is not None:
        logger.removeHandler(_handler)
        _handler = None


def load_mode_of(value: Any) -> LoadMode:
    if isinstance(value, str):
        try:
            return LoadMode[value.strip().upper().replace("+", "_")]
        except KeyError:
            raise ValueError(f"unknown load_mode '{value}': use one of "
                             f"{', '.join(m.name.lower() for m in LoadMode)}") from None
    return LoadMode(value)


def _longhaul_refusals(a: dict[str, Any]) -> list[str]:
    """What longhaul mode refuses among the arguments, each with the reason (the spec's scope)."""
    out = []
    if a["embedding"]:
        out.append("embedding=True: embeddings are not supported in longhaul mode (text generation only)")
    if a["lora_path"]:
        out.append("lora_path: LoRA adapters are not supported in longhaul mode (the routed experts are read "
                   "from the file as they are)")
    if a["draft_model"] is not None:
        out.append("draft_model: speculative decoding is not supported in longhaul mode")
    if a["vocab_only"]:
        out.append("vocab_only=True: vocabulary-only loading is not supported in longhaul mode")
    if a["use_mlock"]:
        out.append("use_mlock=True: longhaul is a load mode of its own (dense weights resident, experts read on "
                   "demand); it does not lock the file's pages")
    return out


@dataclasses.dataclass
class LlamaArgs:
    load_mode: LoadMode
    model: dict[str, Any]
    context: dict[str, Any]
    n_ctx_zero: bool
    lora: tuple[str, float] | None
    keep: list[Any]

    @classmethod
    def build(cls, a: dict[str, Any]) -> LlamaArgs:
        extra = dict(a["kwargs"])
        unknown = sorted(set(extra) - _CONTEXT_FIELDS - _MODEL_FIELDS)
        if unknown:
            raise TypeError(f"Llama() got an unexpected keyword argument '{unknown[0]}' (not a llama-cpp-python "
                            f"argument, nor a llama_model_params or llama_context_params field)")
        if a["load_mode"] is not None:
            mode = load_mode_of(a["load_mode"])
        else:
            mmap = a["use_mmap"] and a["lora_path"] is None
            mode = (LoadMode.MMAP_MLOCK if mmap and a["use_mlock"] else LoadMode.MLOCK if a["use_mlock"]
                    else LoadMode.MMAP if mmap else LoadMode.NONE)
        if mode == LoadMode.LONGHAUL:
            refused = _longhaul_refusals(a)
            if refused:
                raise ValueError("not possible with load_mode='longhaul': " + "; ".join(refused) +
                                 ". Load the model without longhaul (leave load_mode out) for these.")
        if a["draft_model"] is not None:
            raise NotImplementedError("draft_model: speculative decoding is not implemented by longhaul_cpp.Llama; "
                                      "leave it out (the answers are the same without it) or use llama-server "
                                      "--model-draft")
        if a["chat_handler"] is not None and not callable(a["chat_handler"]):
            raise TypeError("chat_handler must be a llama-cpp-python chat completion handler (a callable)")
        _numa(a["numa"])
        keep: list[Any] = []
        model = {k: v for k, v in extra.items() if k in _MODEL_FIELDS}
        model.update(n_gpu_layers=0x7FFFFFFF if a["n_gpu_layers"] == -1 else a["n_gpu_layers"],
                     split_mode=a["split_mode"], main_gpu=a["main_gpu"], vocab_only=a["vocab_only"])
        if a["tensor_split"] is not None:
            n_dev = lib().llama_max_devices()
            if len(a["tensor_split"]) > n_dev:
                raise ValueError(f"tensor_split has {len(a['tensor_split'])} entries, more than the {n_dev} devices "
                                 "the library supports")
            arr = ffi.new("float[]", [float(x) for x in a["tensor_split"]] + [0.0] * (n_dev - len(a["tensor_split"])))
            keep.append(arr)
            model["tensor_split"] = arr
        if a["kv_overrides"]:
            model["kv_overrides"] = _kv_overrides(a["kv_overrides"], keep)
        n_ctx, n_batch = a["n_ctx"], a["n_batch"]
        ctx = {k: v for k, v in extra.items() if k in _CONTEXT_FIELDS}
        ctx.update(n_ctx=n_ctx, n_batch=min(n_ctx, n_batch) if n_ctx else n_batch,
                   n_threads=a["n_threads"] or max((os.cpu_count() or 1) // 2, 1),
                   n_threads_batch=a["n_threads_batch"] or (os.cpu_count() or 1),
                   rope_scaling_type=-1 if a["rope_scaling_type"] is None else a["rope_scaling_type"],
                   pooling_type=a["pooling_type"], attention_type=a["attention_type"],
                   rope_freq_base=a["rope_freq_base"], rope_freq_scale=a["rope_freq_scale"],
                   yarn_ext_factor=a["yarn_ext_factor"], yarn_attn_factor=a["yarn_attn_factor"],
                   yarn_beta_fast=a["yarn_beta_fast"], yarn_beta_slow=a["yarn_beta_slow"],
                   yarn_orig_ctx=a["yarn_orig_ctx"], embeddings=a["embedding"], offload_kqv=a["offload_kqv"],
                   flash_attn_type=1 if a["flash_attn"] else 0, no_perf=a["no_perf"])
        ctx["n_ubatch"] = min(ctx["n_batch"], a["n_ubatch"])
        for name in ("op_offload", "swa_full", "type_k", "type_v"):
            if a[name] is not None:
                ctx[name] = a[name]
        if a["embedding"]:  # one sequence per input of a batch, as llama-cpp-python sets it
            ctx.update(n_seq_max=min(ctx["n_batch"], int(lib().llama_max_parallel_sequences())), kv_unified=True)
        lora = (a["lora_path"], float(a["lora_scale"])) if a["lora_path"] else None
        return cls(mode, model, ctx, n_ctx == 0, lora, keep)

    def finish_context(self, model: Any) -> None:
        """n_ctx=0 means the model's training context (and the batch sizes follow it)."""
        if self.n_ctx_zero:
            n = int(lib().llama_model_n_ctx_train(model.ptr))
            self.context.update(n_ctx=n, n_batch=min(n, self.context["n_batch"]))
            self.context["n_ubatch"] = min(self.context["n_batch"], self.context["n_ubatch"])

    def attach_lora(self, model: Any, ctx: Any) -> Any:
        if self.lora is None:
            return None
        path, scale = self.lora
        L = lib()
        adapter = L.llama_adapter_lora_init(model.ptr, os.fsencode(path))
        if adapter == ffi.NULL:
            raise LlamaError(f"failed to load the LoRA adapter {path} (the log says why)")
        adapters = ffi.new("struct llama_adapter_lora *[1]", [adapter])
        if L.llama_set_adapters_lora(ctx.ptr, adapters, 1, ffi.new("float[1]", [scale])) != 0:
            L.llama_adapter_lora_free(adapter)
            raise LlamaError(f"failed to apply the LoRA adapter {path}")
        return ffi.gc(adapter, L.llama_adapter_lora_free)


def _kv_overrides(overrides: dict[str, Any], keep: list[Any]) -> Any:
    arr = ffi.new("struct llama_model_kv_override[]", len(overrides) + 1)
    keep.append(arr)
    tags = {v: k for k, v in ffi.typeof("enum llama_model_kv_override_type").elements.items()}
    for i, (key, value) in enumerate(overrides.items()):
        raw = key.encode()
        if len(raw) >= 128:
            raise ValueError(f"kv_overrides key {key!r} is longer than 127 bytes")
        arr[i].key = raw
        if isinstance(value, bool):
            arr[i].tag, arr[i].val_bool = tags["LLAMA_KV_OVERRIDE_TYPE_BOOL"], value
        elif isinstance(value, int):
            arr[i].tag, arr[i].val_i64 = tags["LLAMA_KV_OVERRIDE_TYPE_INT"], value
        elif isinstance(value, float):
            arr[i].tag, arr[i].val_f64 = tags["LLAMA_KV_OVERRIDE_TYPE_FLOAT"], value
        elif isinstance(value, str):
            data = value.encode()
            if len(data) >= 128:
                raise ValueError(f"Value for {key} is too long: {value}")
            arr[i].tag, arr[i].val_str = tags["LLAMA_KV_OVERRIDE_TYPE_STR"], data
        else:
            raise ValueError(f"Unknown value type for {key}: {value!r} (bool, int, float or str)")
    return arr


def _numa(numa: bool | int) -> None:
    global _numa_done
    if numa and not _numa_done:
        lib().llama_numa_init(1 if numa is True else int(numa))  # GGML_NUMA_STRATEGY_DISTRIBUTE for True
        _numa_done = True
