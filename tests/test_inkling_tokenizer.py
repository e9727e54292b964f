"""Inkling's tokenizer as its public conversion defines it (../shared/notes/inkling.md): the "inkling"
pre-tokenizer (o200k with \\p{M} in both letter classes), EOS 200006 the only end-of-generation token,
<|end_message|> 200010 not one, no BOS added, special ids from added_tokens_decoder or the last 60 ids below
the real vocabulary size. The library's tokens are compared with an independent Python tokenizer
(tests/inkling_tokenizer_reference.py) on a synthetic BPE vocabulary whose merges make split boundaries
visible.
"""
from __future__ import annotations

import unicodedata

import pytest

from conftest import run
from inkling_tokenizer_reference import OLD_REGEX, ReferenceBpe
from longhaul_cpp import LoadMode, Model, SyntheticSpec, make_model
from longhaul_cpp.models.vocab import (INKLING_ADDED_TOKENS, INKLING_END_MESSAGE_ID, INKLING_EOS_ID,
                                          INKLING_N_SPECIAL_FALLBACK, INKLING_N_VOCAB, inkling_special_ids,
                                          inkling_vocab)
from longhaul_cpp.tools import tool_path

NFD = lambda s: unicodedata.normalize("NFD", s)  # noqa: E731  (decomposed: base letter + combining mark)

# combining marks: the texts the old mapping (GPT-4o's letters-only classes) splits differently
MARK_TEXTS = [
    NFD("café"), NFD("naïve café"), NFD("CAFÉ"), NFD(" cafés!"), NFD("Ÿes naïvely"),
    "नमस्ते दुनिया",                      # Devanagari: vowel signs and virama are marks
    "สวัสดี",                             # Thai: vowel signs above and below are marks
]
TEXTS = MARK_TEXTS + [
    "it's we're DON'T They'LL i'd",       # contractions: attached to the word, any case
    "1234567 12 3456 7",                  # digit runs of at most three
    "Wow!!! ok...// yes!\nno ?!? a  b",   # punctuation runs, with trailing newlines and slashes
    "a\n\n b  \n\t c   ",                 # whitespace rules
    "HTTPServer camelCase XMLHttpRequest",  # case runs
    "Élan ÉCOLE école αβγ ΑΒΓ",           # precomposed non-ASCII letters
    "x = f(a, b);\n\treturn 42",
]


def spec(vocab: str) -> SyntheticSpec:
    # a q8_0 model: the embedding and output matrices have 200k rows
    return SyntheticSpec(arch="inkling", vocab=vocab, n_layer=2, n_layer_dense_lead=1, full_attention_interval=2,
                         n_embd=64, n_head=4, n_head_kv=2, n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=32,
                         n_ff=64, expert_type="q8_0", weight_type="q8_0")


def model_path(model_dir, vocab: str):
    path = model_dir / f"inkling-vocab-{vocab}.gguf"
    if not path.exists():
        make_model(spec(vocab), path)
    return path


@pytest.fixture(scope="module", params=["inkling", "inkling-fallback"])
def vocab_model(request, model_dir):
    with Model(model_path(model_dir, request.param), load_mode=LoadMode.NONE, vocab_only=True) as m:
        yield request.param, m


@pytest.fixture(scope="module")
def reference() -> ReferenceBpe:
    v = inkling_vocab(0)
    return ReferenceBpe(v.tokens, v.merges)


@pytest.mark.parametrize("text", TEXTS)
def test_tokens_follow_the_inkling_regex(vocab_model, reference, text) -> None:
    _, m = vocab_model
    expected = reference.encode(text)
    assert m.tokenize(text, add_special=False).tolist() == expected
    assert m.tokenize(text, add_special=True).tolist() == expected  # no BOS is added
    assert m.detokenize(expected) == text


def test_texts_tell_the_old_mapping_apart(reference) -> None:
    # sensitivity: with GPT-4o's letters-only classes every mark text gives other tokens, so the test above
    # fails on the old mapping; the merges make the split visible (a mark merged with its base letter)
    for text in MARK_TEXTS:
        assert reference.encode(text) != reference.encode(text, OLD_REGEX), text
        assert reference.pre_tokenize(text) != reference.pre_tokenize(text, OLD_REGEX), text
    assert len(reference.encode(NFD("café"))) == 1  # the merges of the vocabulary reach whole words


def test_eos_is_the_only_end_of_generation_token(vocab_model) -> None:
    _, m = vocab_model
    assert m.is_eog(INKLING_EOS_ID)
    eog = [i for i in range(INKLING_N_VOCAB - INKLING_N_SPECIAL_FALLBACK, INKLING_N_VOCAB) if m.is_eog(i)]
    # <|end_message|> and the o200k-style <|endoftext|> and <|end|> (end-of-generation by upstream's generic
    # text rules) are not
    assert eog == [INKLING_EOS_ID]


def test_special_ids_from_added_tokens_decoder_or_the_fallback(vocab_model) -> None:
    vocab, m = vocab_model
    assert m.tokenize("<|end_message|>", add_special=False, parse_special=True).tolist() == [INKLING_END_MESSAGE_ID]
    # an id of the last 60 that added_tokens_decoder does not list: special only by the fallback
    reserved = "<|reserved_special_200050|>"
    ids = m.tokenize(reserved, add_special=False, parse_special=True).tolist()
    if vocab == "inkling-fallback":
        assert ids == [200050]
    else:
        assert len(ids) > 1 and 200050 not in ids
    # control tokens render as nothing unless asked for
    assert m.token_to_piece(INKLING_END_MESSAGE_ID) == b""


def test_special_id_rule() -> None:
    assert inkling_special_ids(INKLING_N_VOCAB, INKLING_ADDED_TOKENS) == sorted(INKLING_ADDED_TOKENS)
    assert inkling_special_ids(INKLING_N_VOCAB, None) == list(range(199998, 200058))
    assert inkling_special_ids(INKLING_N_VOCAB, {}) == list(range(199998, 200058))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        inkling_special_ids(100, {100: "<|x|>"})
    with pytest.raises(ValueError, match="arch inkling"):
        SyntheticSpec(arch="qwen3moe", vocab="inkling").validate()


@pytest.mark.parametrize("bias_token,stops", [(INKLING_EOS_ID, True), (INKLING_END_MESSAGE_ID, False)])
def test_generation_stops_at_eos_not_at_end_message(model_dir, bias_token, stops) -> None:
    path = model_path(model_dir, "inkling")
    # the logit bias makes the token win every step; greedy sampling in llama-completion
    r = run([str(tool_path("llama-completion")), "-m", str(path), "-p", "hello", "-n", "6", "--temp", "0",
             "-no-cnv", "--no-display-prompt", "-t", "2", "-c", "256", "--no-warmup", "--special",
             "--logit-bias", f"{bias_token}+100"], timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    out = r.stdout.decode(errors="replace")
    text = INKLING_ADDED_TOKENS[bias_token]
    if stops:
        assert out.count(text) == 1, out  # EOS is shown (--special) and ends generation at once
    else:
        assert out.count(text) == 6, out  # 200010 does not: all 6 tokens are generated
