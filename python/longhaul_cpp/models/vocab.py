"""The tokenizers of synthetic models (SyntheticSpec.vocab).

- "bytes" (every arch): a byte-level SPM vocabulary, <unk> <s> </s> and one token per byte.
- "inkling" (arch inkling): Inkling's tokenizer as its public conversion writes it: a byte-level
  BPE ("gpt2") vocabulary with the pre-tokenizer "inkling", Inkling's vocabulary size and special
  ids (EOS 200006, the only end-of-generation token; <|end_message|> 200010; BOS pinned to EOS and
  never added). The regular tokens are the 256 bytes plus a few merges chosen so that where the
  pre-tokenizer splits changes the tokens (combining marks, contractions, digit and punctuation
  runs); the other ids up to the special range are unused fillers. The special ids come from an
  `added_tokens_decoder` table, with the conversion's fallback when a tokenizer has none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gguf

# Inkling (../shared/notes/inkling.md): real vocabulary 200058 ids, EOS = BOS = 200006
INKLING_N_VOCAB = 200058
INKLING_EOS_ID = 200006
INKLING_END_MESSAGE_ID = 200010
INKLING_N_SPECIAL_FALLBACK = 60  # without added_tokens_decoder: the last 60 ids below the real vocabulary size

# the special tokens of the synthetic Inkling tokenizer, as a tokenizer_config's added_tokens_decoder would
# list them. Only the ids of EOS and <|end_message|> and the content markers' texts are Inkling's; the other
# texts are o200k-style names placed so that upstream's generic end-of-generation rules (<|endoftext|>,
# <|end|>) would fire if the Inkling rule did not override them.
INKLING_ADDED_TOKENS: dict[int, str] = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    INKLING_EOS_ID: "<|end_of_turn|>",
    200007: "<|end|>",
    200008: "<|content_text|>",
    200009: "<|content_thinking|>",
    INKLING_END_MESSAGE_ID: "<|end_message|>",
}


def _spell(word: str) -> tuple[tuple[bytes, bytes], ...]:
    """Merges that build each character of `word` from its UTF-8 bytes, then `word` from its characters."""
    out: list[tuple[bytes, bytes]] = []

    def join(parts: list[bytes]) -> None:
        for i in range(1, len(parts)):
            pair = (b"".join(parts[:i]), parts[i])
            if pair not in out:
                out.append(pair)

    for c in word:
        join([bytes([b]) for b in c.encode("utf-8")])
    join([c.encode("utf-8") for c in word])
    return tuple(out)


# merges of the synthetic Inkling vocabulary, in rank order, as (left, right) UTF-8 byte strings; each side
# is a byte or an earlier merge. Chosen so that a different pre-tokenizer split changes the tokens: a
# combining mark merged with its base letter (Latin, Devanagari virama, Thai vowel sign), contractions,
# digits across a run of three, punctuation with what follows it.
INKLING_MERGES: tuple[tuple[bytes, bytes], ...] = (
    (b"\xcc", b"\x81"), (b"e", b"\xcc\x81"), (b"E", b"\xcc\x81"),  # U+0301 combining acute accent, then e/E + it
    (b"c", b"a"), (b"ca", b"f"), (b"caf", b"e\xcc\x81"),
    (b"\xcc", b"\x88"), (b"i", b"\xcc\x88"), (b"a", b"i\xcc\x88"), (b"n", b"ai\xcc\x88"),  # U+0308 diaeresis
    (b"'", b"s"), (b"i", b"t"), (b"it", b"'s"), (b"'", b"r"), (b"'r", b"e"), (b"w", b"e"), (b"we", b"'re"),
    (b"'", b"T"), (b"N", b"'T"),
    (b"1", b"2"), (b"12", b"3"), (b"3", b"4"), (b"4", b"5"), (b"45", b"6"), (b"6", b"7"),
    (b"!", b"!"), (b"!!", b"!"), (b".", b"."), (b"..", b"/"), (b"!", b"\n"),
    (b" ", b"a"), (b" ", b" "), (b"\n", b"\n"),
) + _spell("\u0938\u094d") + _spell("\u0e27\u0e31")  # Devanagari sa + virama, Thai wo waen + mai han-akat


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_text(data: bytes) -> str:
    """`data` in the byte-level alphabet (how a BPE vocabulary spells it)."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def inkling_special_ids(n_vocab: int, added_tokens_decoder: Mapping[int, str] | None) -> list[int]:
    """The ids the conversion marks as special (control) tokens: those of added_tokens_decoder, or, when the
    tokenizer has none, the last INKLING_N_SPECIAL_FALLBACK ids below the real vocabulary size `n_vocab`."""
    if added_tokens_decoder:
        ids = sorted(int(i) for i in added_tokens_decoder)
        bad = [i for i in ids if not 0 <= i < n_vocab]
        if bad:
            raise ValueError(f"added_tokens_decoder id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
        return ids
    return list(range(n_vocab - INKLING_N_SPECIAL_FALLBACK, n_vocab))


@dataclass(frozen=True)
class BpeVocab:
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    merges: list[str]  # "left right" in the byte-level alphabet, rank order
    eos_id: int


def inkling_vocab(n_vocab_pad: int, *, added_tokens_decoder: bool = True) -> BpeVocab:
    """The synthetic Inkling vocabulary: INKLING_N_VOCAB ids plus `n_vocab_pad` padded rows. The special ids
    come from INKLING_ADDED_TOKENS as an added_tokens_decoder, or (added_tokens_decoder=False: a tokenizer
    without one) from the conversion's fallback; the token texts are the same either way."""
    table = bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    merges = []
    for left, right in INKLING_MERGES:
        a, b = byte_text(left), byte_text(right)
        missing = [t for t in (a, b) if t not in tokens]
        if missing:
            raise AssertionError(f"merge side {missing[0]!r} is not a token yet")
        if a + b in tokens:
            raise AssertionError(f"merge {left!r} {right!r} makes a token twice")
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    n_regular = len(tokens)
    tokens += [f"<|filler_{i}|>" for i in range(n_regular, INKLING_N_VOCAB)]
    for i in range(INKLING_N_VOCAB - INKLING_N_SPECIAL_FALLBACK, INKLING_N_VOCAB):
        tokens[i] = INKLING_ADDED_TOKENS.get(i, f"<|reserved_special_{i}|>")
    types = [int(gguf.TokenType.NORMAL)] * n_regular + [int(gguf.TokenType.UNUSED)] * (INKLING_N_VOCAB - n_regular)
    for i in inkling_special_ids(INKLING_N_VOCAB, INKLING_ADDED_TOKENS if added_tokens_decoder else None):
        if i < n_regular:
            raise ValueError(f"special id {i} overlaps the regular tokens (0..{n_regular - 1})")
        types[i] = int(gguf.TokenType.CONTROL)
    tokens += [f"<|pad_{i}|>" for i in range(n_vocab_pad)]
    types += [int(gguf.TokenType.UNUSED)] * n_vocab_pad
    return BpeVocab(tokens=tokens, types=types, merges=merges, eos_id=INKLING_EOS_ID)


def regular_token_count() -> int:
    """Ids below this are bytes and merges (the tokens text can produce)."""
    return 256 + len(INKLING_MERGES)
