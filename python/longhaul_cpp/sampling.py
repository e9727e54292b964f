"""The library's sampler chain and chat templates, as the high-level API (`Llama`) uses them."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._lib import Handle, LlamaError, ffi, lib

if TYPE_CHECKING:
    from .context import Context
    from .model import Model

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler; checked on creation (ValueError naming the argument)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature >= 0, "top_p": 0 <= self.top_p <= 1, "min_p": 0 <= self.min_p <= 1,
            "repeat_penalty": self.repeat_penalty > 0, "penalty_last_n": self.penalty_last_n >= -1,
            "frequency_penalty": abs(self.frequency_penalty) < float("inf"),
            "presence_penalty": abs(self.presence_penalty) < float("inf"),
            "seed": 0 <= self.seed <= 0xFFFFFFFF,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise ValueError(f"{name}={value!r} is out of range (temperature >= 0, 0 <= top_p, min_p <= 1, "
                                 f"repeat_penalty > 0, finite frequency and presence penalties, 0 <= seed < 2^32)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer (<= 0 keeps every token), got {self.top_k!r}")


class Sampler(Handle):
    """A `llama_sampler` chain in llama.cpp's usual order: repetition penalties, top-k, top-p, min-p,
    temperature, then a seeded draw; temperature 0 picks the most likely token (greedy)."""

    _what = "sampler"

    def __init__(self, model: Model, params: SamplingParams) -> None:
        self._ptr = ffi.NULL
        L = lib()
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._ptr = chain
        if (params.repeat_penalty, params.frequency_penalty, params.presence_penalty) != (1.0, 0.0, 0.0):
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(
                model.n_vocab, params.penalty_last_n, params.repeat_penalty, params.frequency_penalty,
                params.presence_penalty))
        if params.temperature <= 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            return
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(params.top_k))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(params.top_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(params.min_p, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(params.temperature))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(params.seed))

    def sample(self, ctx: Context) -> int:
        """The next token from the last decoded token's logits (the chain also records it as accepted)."""
        return int(lib().llama_sampler_sample(self.ptr, ctx.ptr, -1))

    def close(self) -> None:
        if self._ptr != ffi.NULL:
            lib().llama_sampler_free(self._ptr)
            self._ptr = ffi.NULL


def model_chat_template(model: Model) -> str | None:
    """The model's own chat template (`tokenizer.chat_template`), or None."""
    p = lib().llama_model_chat_template(model.ptr, ffi.NULL)
    return None if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def apply_chat_template(template: str, messages: Sequence[Mapping[str, Any]], *, add_assistant: bool = True) -> str:
    """The prompt for `messages` ({"role", "content"} dicts) by the library's template support: a
    template's text (recognized among the built-in ones) or a built-in name such as "chatml"."""
    keep: list[Any] = []
    chat = ffi.new("struct llama_chat_message[]", max(1, len(messages)))
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with a string 'role' and a 'content', got {m!r}")
        content = m["content"]
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}")
        keep += [ffi.new("char[]", m["role"].encode()), ffi.new("char[]", content.encode())]
        chat[i].role, chat[i].content = keep[-2], keep[-1]
    tmpl = template.encode()
    L = lib()
    size = 1024 + 2 * sum(len(k) for k in keep)
    for _ in range(2):
        buf = ffi.new("char[]", size)
        n = L.llama_chat_apply_template(tmpl, chat, len(messages), add_assistant, buf, size)
        if n < 0:
            raise LlamaError(f"the chat template is not one the library supports ({template[:60]!r}...): pass "
                             "chat_format= a built-in name such as 'chatml', 'llama3' or 'mistral-v7'")
        if n <= size:
            return ffi.unpack(buf, n).decode("utf-8", "replace")
        size = n + 1
    raise LlamaError("llama_chat_apply_template kept asking for a larger buffer")
