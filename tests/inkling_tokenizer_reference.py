"""An independent Python tokenizer for Inkling's pre-tokenizer "inkling": the o200k regex with \\p{M} in both
letter classes (combining marks stay with their base letter), run with the `regex` module, then byte-level
BPE by merge rank. Written from the facts in ../shared/notes/inkling.md, not from the library's code
(only the byte alphabet, the vocabulary's spelling, comes from the generator).

The regex is written in the lookahead form llama.cpp's generic regex path runs (its engine has no letter
case classes): a run of letters or marks other than a-z, then one of letters or marks other than A-Z.
OLD_REGEX is the mapping the fork used before (GPT-4o's, letters only): the sensitivity check shows the
test texts tell the two apart.
"""
from __future__ import annotations

import regex

from longhaul_cpp.models.vocab import bytes_to_unicode

_SUFFIX = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"


def _o200k(letter: str) -> str:
    upper = f"((?=[{letter}])([^a-z]))"
    lower = f"((?=[{letter}])([^A-Z]))"
    return (f"[^\\r\\n\\p{{L}}\\p{{N}}]?{upper}*{lower}+{_SUFFIX}"
            f"|[^\\r\\n\\p{{L}}\\p{{N}}]?{upper}+{lower}*{_SUFFIX}"
            "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


INKLING_REGEX = _o200k("\\p{L}\\p{M}")
OLD_REGEX = _o200k("\\p{L}")


class ReferenceBpe:
    """Byte-level BPE over a GGUF vocabulary (tokens and "left right" merges)."""

    def __init__(self, tokens: list[str], merges: list[str]) -> None:
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        self.byte_chars = bytes_to_unicode()  # the vocabulary's spelling of bytes (GPT-2's alphabet)

    def pre_tokenize(self, text: str, pattern: str = INKLING_REGEX) -> list[str]:
        return [m.group(0) for m in regex.finditer(pattern, text)]

    def _bpe(self, word: str) -> list[str]:
        parts = [self.byte_chars[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: self.ranks.get((parts[i], parts[i + 1]), 1 << 62))
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        return parts

    def encode(self, text: str, pattern: str = INKLING_REGEX) -> list[int]:
        return [self.ids[p] for word in self.pre_tokenize(text, pattern) for p in self._bpe(word)]
