"""`LlamaTokenizer`, as llama-cpp-python 0.3.36's (`Llama.tokenizer()`): bytes in and out, with str helpers
(`from_ggml_file` is left out: `Llama(path, vocab_only=True).tokenizer()` is the same)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tokenizing(Protocol):
    """What a tokenizer uses of its `Llama`: named here so that this module does not import llama.py, which imports
    this one."""

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes: ...


class LlamaTokenizer:
    def __init__(self, llama: Tokenizing) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, special=special)  # prev_tokens: unused, as there

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

