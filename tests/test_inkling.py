"""The Inkling architecture in the fork against an independent NumPy reference
(tests/inkling_reference.py), and longhaul on Inkling against a normal load.

The tiny synthetic model has 4 layers (layer 0 dense), global attention on layers 1 and 3 and a
sliding window of 16 on layers 0 and 2, bias bands of 24 (global) and 12 (SWA) positions, 16
routed experts (top-3) and the 2 shared ones: a 60-token prompt crosses the window and both bands.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import inkling_reference as ref
from longhaul_cpp import LlamaError, LoadMode, Model, SyntheticSpec
from longhaul_cpp.modelinfo import wave_syncs

PROMPT = "Inkling: banded relative bias, short convolutions, sink-normalized routing!! "  # 78 bytes
N_DECODE = 16
# float32 kernels against a float64 reference: the largest logit error relative to the logit range
REL_TOL = 2e-3


def tiny_spec(**kw) -> SyntheticSpec:
    base = dict(arch="inkling", n_layer=4, n_layer_dense_lead=1, full_attention_interval=2, n_embd=64, n_head=4,
                n_head_kv=2, n_expert=16, n_expert_used=3, n_ff_exp=32, n_ff_shexp=32, n_ff=96,
                expert_type="f32", weight_type="f32", n_swa=16, d_rel=8, rel_extent=24, rel_extent_swa=12)
    base.update(kw)
    return SyntheticSpec(**base)


@pytest.fixture(scope="module")
def inkling_model(model_dir):
    from longhaul_cpp import make_model

    return make_model(tiny_spec(), model_dir / "inkling-tiny-f32.gguf")[0]


@pytest.fixture(scope="module")
def reference(inkling_model):
    return ref.load(inkling_model)


def _run(path, n_ubatch: int, **model_kw) -> tuple[list[int], list[np.ndarray], list[int]]:
    """Prompt in ubatches of n_ubatch, then greedy decode steps; the logits after each."""
    with Model(path, n_gpu_layers=0, **model_kw) as m, \
            m.context(n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2) as ctx:
        prompt = [int(t) for t in m.tokenize(PROMPT, add_special=False)]
        ctx.decode(prompt)
        logits = [ctx.logits().copy()]
        out: list[int] = []
        for _ in range(N_DECODE):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            ctx.decode([tok])
            logits.append(ctx.logits().copy())
        return prompt, logits, out


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    finite = np.isfinite(b)
    assert np.array_equal(finite, np.isfinite(a)), "padded ids must be -inf exactly where the reference has them"
    return float(np.max(np.abs(a[finite] - b[finite])) / (np.max(b[finite]) - np.min(b[finite])))


@pytest.mark.parametrize("n_ubatch", [256, 16, 7])  # the prompt in one ubatch, in 5, in 11
def test_inkling_matches_numpy_reference(inkling_model, reference, n_ubatch) -> None:
    w, hp = reference
    prompt, logits, gen = _run(inkling_model, n_ubatch)
    assert len(prompt) > 24 + 16  # longer than the window and the widest band
    full = ref.forward(w, hp, prompt + gen)
    n_p = len(prompt)
    errs = [_rel_err(logits[s], full[n_p - 1 + s]) for s in range(N_DECODE + 1)]
    assert max(errs) < REL_TOL, errs
    # the same greedy tokens as the reference
    assert gen == [int(np.argmax(full[n_p - 1 + s])) for s in range(N_DECODE)]
    # the padded vocabulary rows are masked
    assert np.all(np.isneginf(logits[0][hp["unpadded_vocab_size"]:]))


@pytest.mark.parametrize("layers", [{"n_layer": 2, "n_layer_dense_lead": 0, "full_attention_interval": 4},
                                    {"full_attention_interval": 1}], ids=["no global layer", "no SWA layer"])
def test_inkling_without_one_kind_of_attention_layer(make_model, layers) -> None:
    """A model whose layers are all sliding-window (two layers, every fourth global) or all global leaves one input
    of the graph unread, without a buffer. The fuzzer's first finding (ci/sanitize.sh fuzz, on the seed corpus's
    two-layer Inkling model): a store through a null pointer, a segfault without the sanitizer. Both loads decode
    such a model, and match the NumPy reference."""
    spec = tiny_spec(**layers)
    path = make_model(**dataclasses.asdict(spec))[0]
    w, hp = ref.load(path)
    prompt, logits, gen = _run(path, 16)
    full = ref.forward(w, hp, prompt + gen)
    n_p = len(prompt)
    assert max(_rel_err(logits[s], full[n_p - 1 + s]) for s in range(N_DECODE + 1)) < REL_TOL
    _, lh_logits, lh_gen = _run(path, 16, load_mode=LoadMode.LONGHAUL, longhaul_cache=1)
    assert lh_gen == gen and all(np.array_equal(a, b) for a, b in zip(lh_logits, logits))


def test_inkling_shared_width_as_published(inkling_model, make_model) -> None:
    """The public converter writes the shared experts as `ffn_{gate,up,down}_shexp` (3-D, two experts) and no
    `expert_shared_feed_forward_length`: their width is the routed experts'. A file with the key and another width
    (which no converter writes, but the key is read where present) runs with that width."""
    import gguf

    r = gguf.GGUFReader(str(inkling_model))
    assert "inkling.expert_shared_feed_forward_length" not in r.fields
    shexp = [t for t in r.tensors if "shexp" in t.name]
    assert shexp and all(re.search(r"\.ffn_(gate|up|down)_shexp\.weight$", t.name) for t in shexp)
    assert all(sorted(t.shape.tolist()) == [2, 32, 64] for t in shexp)

    path = make_model(**dataclasses.asdict(tiny_spec(n_ff_shexp=48)))[0]
    assert "inkling.expert_shared_feed_forward_length" in gguf.GGUFReader(str(path)).fields
    w, hp = ref.load(path)
    prompt, logits, gen = _run(path, 16)
    full = ref.forward(w, hp, prompt + gen)
    assert max(_rel_err(logits[s], full[len(prompt) - 1 + s]) for s in range(N_DECODE + 1)) < REL_TOL


def test_reference_is_sensitive_to_the_bias_and_convs(reference, inkling_model) -> None:
    """The test above would not notice a missing bias band or short conv if they did not matter."""
    w, hp = reference
    toks = list(range(10, 70))
    base = ref.forward(w, hp, toks)
    for name in ("blk.1.attn_rel_proj.weight", "blk.2.attn_rel_proj.weight", "blk.1.shortconv_k.weight",
                 "blk.0.shortconv_v.weight", "blk.2.shortconv_attn.weight", "blk.1.shortconv_mlp.weight"):
        w2 = dict(w)
        w2[name] = np.zeros_like(w[name])
        assert _rel_err(ref.forward(w2, hp, toks), base) > 20 * REL_TOL, name


def test_inkling_state_is_saved_and_restored(inkling_model) -> None:
    """The short-conv state is per-sequence memory, saved and restored with the KV cache: a restored
    state continues identically (and differs from a state one token behind)."""
    with Model(inkling_model, n_gpu_layers=0) as m, m.context(n_ctx=256, n_threads=2) as ctx:
        prompt = [int(t) for t in m.tokenize(PROMPT, add_special=False)]
        ctx.decode(prompt[:-1])
        state = ctx.state_get()
        a = list(ctx.greedy(prompt[-1:], 8))
        ctx.reset()
        ctx.decode(prompt[:5])  # something else in the memory first
        ctx.state_set(state)
        assert ctx.n_past == len(prompt) - 1
        b = list(ctx.greedy(prompt[-1:], 8))
        ctx.reset()
        ctx.decode(prompt[:-2])
        ctx.state_set(ctx.state_get())
        c = list(ctx.greedy(prompt[-1:], 8))  # one token behind: another continuation
    assert a == b
    assert len(a) == 8 and c != a


def test_inkling_refuses_flash_attention(inkling_model) -> None:
    with Model(inkling_model, n_gpu_layers=0) as m:
        with pytest.raises(LlamaError, match="flash attention"):
            m.context(n_ctx=256, flash_attn_type=1)  # LLAMA_FLASH_ATTN_TYPE_ENABLED


# ---- longhaul for Inkling ---------------------------------------------------------------------

def small_shape_spec(**kw) -> SyntheticSpec:
    """Inkling-Small's routing shape (256 routed experts, top-6, 2 shared) with tiny dims."""
    return tiny_spec(n_expert=256, n_expert_used=6, expert_type="q8_0", weight_type="f16", **kw)


def _budget(spec: SyntheticSpec, slots: int) -> str:
    return f"{spec.budget_for(slots)}B"


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("slots", [256, 7, 5, 2])
def test_longhaul_inkling_equals_normal_load(make_model, caplog, shards, slots) -> None:
    import logging

    spec = small_shape_spec()
    paths = make_model(n_shards=shards, **dataclasses.asdict(spec))
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        with Model(paths[0], n_gpu_layers=0, load_mode=LoadMode.LONGHAUL, longhaul_cache=_budget(spec, slots),
                   use_extra_bufts=False) as m:
            st0 = m.longhaul_stats()
            # only the routed banks stream: the shared experts are neither cached nor counted
            assert len(st0.layers) == len(spec.moe_layers())
            assert all(layer.n_slots == slots and layer.expert_bytes == spec.expert_bytes() for layer in st0.layers)
            with m.context(n_ctx=256, n_ubatch=256, n_threads=2) as ctx:
                n_ubatch = ctx.n_ubatch
                prompt = [int(t) for t in m.tokenize(PROMPT, add_special=False)]
                ids = list(ctx.greedy(prompt, N_DECODE))
                logits = ctx.logits().copy()
            st = m.longhaul_stats()
    k = spec.n_expert_used
    # 7 slots: one stage per MoE layer and token; 5 slots: two stages (the ubatch becomes 1)
    stages = -(-k // slots)
    assert n_ubatch == (1 if slots < k else 256)
    if slots < k:
        assert all(layer.n_stages == stages * layer.n_batches for layer in st.layers)
        assert any(f"routed MoE runs one token at a time in {stages} stages" in r.getMessage() for r in caplog.records)
    else:
        # one stage per decode step; the prompt (one ubatch) in ceil(min(n_expert, n_prompt * k) / slots) waves,
        # one synchronization per wave of its graph (compact waves: more, the last ones empty)
        waves = wave_syncs(slots, spec.n_expert, k, len(prompt))
        assert all(layer.n_stages == layer.n_batches - 1 + waves for layer in st.layers)
        if slots < spec.n_expert:
            assert any("expert waves" in r.getMessage() for r in caplog.records)
    assert st.total.n_misses > 0
    with Model(paths[0], n_gpu_layers=0, use_extra_bufts=False) as m, \
            m.context(n_ctx=256, n_ubatch=n_ubatch, n_threads=2) as ctx:
        ref_ids = list(ctx.greedy([int(t) for t in m.tokenize(PROMPT, add_special=False)], N_DECODE))
        ref_logits = ctx.logits().copy()
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)


def test_longhaul_inkling_budget_plan(make_model) -> None:
    """info: 7 slots -> 1 stage; 5 slots -> 2 stages, ubatch 1; the shared experts are not routed bytes."""
    from longhaul_cpp.modelinfo import inspect_model

    spec = small_shape_spec()
    path = make_model(**dataclasses.asdict(spec))[0]
    info = inspect_model(path)
    assert info.supported and info.arch == "inkling"
    assert set(info.expert_bytes) == set(spec.moe_layers())
    assert all(b == spec.expert_bytes() for b in info.expert_bytes.values())
    seven, five = (spec.budget_for(slots) for slots in (7, 5))
    assert info.stages(seven) == 1 and info.effective_ubatch(seven) == 512
    assert info.stages(five) == 2 and info.effective_ubatch(five) == 1
