"""The longhaul load mode in libllama (CPU): identical output to a normal load, counters, errors.

Exactness: longhaul's expert slots take the layout a normal load gives the bank (the CPU's repacked
layout where it repacks that type and shape, else the plain GGUF layout), so the reference is the
normal load with the same buffer types: the default one, `use_extra_bufts=False` (plain kernels for
every weight), or the expert banks kept plain in both (`plain_expert_banks()`). Token ids and logits
must then be bit-identical on any CPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil

import numpy as np
import pytest

from longhaul_cpp import LlamaError, LoadMode, LonghaulFlag, Model, SyntheticSpec, lib, parse_cache_size, plain_expert_banks
from longhaul_cpp.longhaul import failing_read
from longhaul_cpp._lib import ffi
from longhaul_cpp.modelinfo import expert_waves, wave_syncs

from conftest import repacked_mib


PROMPT = ("Longhaul keeps dense weights resident and streams routed experts from the file; "
          "the expert cache has a fixed budget.")
N_GEN = 32

ARCH_TYPES = [
    ("qwen3moe", "f16", {}), ("qwen3moe", "q4_0", {}),
    ("qwen35moe", "q8_0", {}), ("qwen35moe", "q4_0", {"merged_gate_up": True}),
    ("laguna", "f32", {}), ("laguna", "q8_0", {}),
]


def spec_of(arch: str, et: str, extra: dict) -> SyntheticSpec:
    return SyntheticSpec(arch=arch, expert_type=et, weight_type="f16", n_expert=16, n_expert_used=4, **extra)


def budget_for(spec: SyntheticSpec, slots: int) -> str:
    return f"{spec.budget_for(slots)}B"


def run_greedy(path, n_ubatch: int, text: str = PROMPT, **model_kw) -> tuple[list[int], np.ndarray, dict]:
    """Greedy ids over `text` + N_GEN tokens and the last-position logits."""
    with Model(path, **model_kw) as m, m.context(n_ctx=512, n_batch=512, n_ubatch=n_ubatch, n_threads=2) as ctx:
        eff = ctx.n_ubatch
        prompt = m.tokenize(text)
        assert len(prompt) >= 64
        ids = list(ctx.greedy(prompt, N_GEN))
        info = {"n_ubatch": eff, "n_prompt": len(prompt)}
        if m.is_longhaul:
            info["stats"] = m.longhaul_stats()
            info["flags"] = m.longhaul_flags
        return ids, ctx.logits().copy(), info


@functools.lru_cache(maxsize=None)
def reference(path, n_ubatch: int, *, bufts: str = "plain") -> tuple[list[int], np.ndarray]:
    """The normal load with longhaul's kernels, once per (model, n_ubatch, bufts): greedy ids and last logits.
    `bufts`: "plain" (use_extra_bufts=False: plain kernels everywhere), "default" (the CPU's optimized
    buffer types, expert banks repacked where it repacks them), "plain_experts" (default, but the expert
    banks kept plain: plain_expert_banks())."""
    with plain_expert_banks() if bufts == "plain_experts" else contextlib.nullcontext():
        ids, logits, _ = run_greedy(path, n_ubatch, load_mode=LoadMode.NONE, use_extra_bufts=bufts != "plain")
    logits.flags.writeable = False  # shared between tests
    return ids, logits


@pytest.mark.parametrize("arch,et,extra", ARCH_TYPES, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("slots", ["all", "2k", "3k/2", "k", "staged", "1"])
def test_longhaul_equals_normal_load(make_model, arch, et, extra, shards, slots) -> None:
    """Budgets: every expert cached; 2k, 3k/2 and k slots (the prompt runs in 2, 3 and 4 expert
    waves); fewer than k (one token at a time, 2 stages); 1 slot (k stages)."""
    spec = spec_of(arch, et, extra)
    paths = make_model(n_shards=shards, **dataclasses.asdict(spec))
    k = spec.n_expert_used
    n_slots = {"all": spec.n_expert, "2k": 2 * k, "3k/2": 3 * k // 2, "k": k, "staged": k - 1, "1": 1}[slots]
    ids, logits, info = run_greedy(paths[0], 512, load_mode=LoadMode.LONGHAUL,
                                   longhaul_cache=budget_for(spec, n_slots), use_extra_bufts=False)
    # the ubatch is kept unless one token's experts do not fit (then tokens run one at a time)
    assert info["n_ubatch"] == (512 if n_slots >= k else 1)
    st = info["stats"]
    assert all(layer.n_slots == n_slots for layer in st.layers)
    assert st.total.n_misses > 0
    if n_slots < k:  # staged MoE: every token runs ceil(k / slots) stages
        assert all(layer.n_stages == -(-k // n_slots) * layer.n_batches for layer in st.layers)
    else:  # the prompt (one ubatch) runs in ceil(min(n_expert, n_prompt * k) / slots) waves, decode in one
        assert expert_waves(n_slots, spec.n_expert, k, info["n_prompt"]) == {"all": 1, "2k": 2, "3k/2": 3, "k": 4}[slots]
        # one synchronization per wave of the graph (compact waves: more, the last ones empty)
        waves = wave_syncs(n_slots, spec.n_expert, k, info["n_prompt"])
        # some archs compute only the output rows (1 token) in the last layer: one wave there
        last = spec.n_layer - 1
        assert all(layer.n_stages - (layer.n_batches - 1) in ((waves,) if layer.il != last else (1, waves))
                   for layer in st.layers)
    ref_ids, ref_logits = reference(paths[0], info["n_ubatch"])
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)  # same plain kernels: bit-exact


# the repackable types on x86 (AVX2 and up) and ARM; experts and resident 2-D weights both quantized
REPACK_TYPES = [("qwen3moe", "q4_0", {}), ("qwen35moe", "q4_0", {"merged_gate_up": True}), ("laguna", "q4_0", {}),
                ("inkling", "q4_0", {}), ("qwen3moe", "q8_0", {})]


@pytest.mark.parametrize("arch,et,extra", REPACK_TYPES, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("slots", ["all", "2k", "k", "staged", "1", "2k direct", "staged direct"])
def test_longhaul_equals_default_load(make_model, caplog, arch, et, extra, shards, slots) -> None:
    """Default buffer types (the CPU's repacked layouts on): where a normal load repacks an expert bank,
    longhaul's slots take the same layout (each expert converted as it is read), so both run the same
    kernels on any CPU: token ids and logits bit-exact, in waves and in stages too; also with the reads
    that bypass the page cache (O_DIRECT, adjacent experts read together), which a memory limit selects."""
    spec = dataclasses.replace(spec_of(arch, et, extra), weight_type="q4_0")
    paths = make_model(n_shards=shards, **dataclasses.asdict(spec))
    k = spec.n_expert_used
    flags = LonghaulFlag(0)
    if slots.endswith(" direct"):
        flags = LonghaulFlag.DIRECT_IO
        slots = slots.split()[0]
    n_slots = {"all": spec.n_expert, "2k": 2 * k, "k": k, "staged": k - 1, "1": 1}[slots]
    ids, logits, info = run_greedy(paths[0], 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, n_slots),
                                   longhaul_flags=flags)
    if flags:  # the models' folder takes O_DIRECT (conftest.model_dir): the reads really bypassed the page cache
        assert info["flags"] & LonghaulFlag.DIRECT_IO
    ref_ids, ref_logits = reference(paths[0], info["n_ubatch"], bufts="default")
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)
    # the slots really are repacked wherever this CPU repacks the banks: every byte read was converted
    st = info["stats"].total
    default, plain_experts = repacked_mib(caplog, paths[0]), repacked_mib(caplog, paths[0], plain_experts=True)
    if default > plain_experts:
        assert st.bytes_converted == st.bytes_read > 0 and st.t_convert_s > 0
    else:  # no repacked kernels for these banks here
        assert st.bytes_converted == 0


@pytest.mark.parametrize("arch,et,extra", REPACK_TYPES[:2], ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("slots", ["all", "2k", "staged"])
def test_plain_expert_banks_in_both_loads(make_model, caplog, arch, et, extra, slots) -> None:
    """plain_expert_banks() (a test hook of the library) keeps the routed experts plain in any load (banks of a normal load,
    slots of longhaul) while the resident weights stay repacked: bit-exact too, nothing converted."""
    spec = dataclasses.replace(spec_of(arch, et, extra), weight_type="q4_0")
    path = make_model(**dataclasses.asdict(spec))[0]
    k = spec.n_expert_used
    n_slots = {"all": spec.n_expert, "2k": 2 * k, "staged": k - 1}[slots]
    with plain_expert_banks():
        ids, logits, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, n_slots))
    assert info["stats"].total.bytes_converted == 0
    ref_ids, ref_logits = reference(path, info["n_ubatch"], bufts="plain_experts")
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)
    # the reference really is the mixed configuration: where this CPU repacks Q4_0 at all, it repacks
    # the resident weights there, and less than the default load (which repacks the experts too)
    default, mixed = repacked_mib(caplog, path), repacked_mib(caplog, path, plain_experts=True)
    assert (default == mixed == 0) or 0 < mixed < default


@pytest.mark.parametrize("arch,et,extra", REPACK_TYPES[:2], ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("slots", ["all", "2k", "staged", "2k direct"])
def test_no_repack_keeps_the_slots_plain(make_model, caplog, arch, et, extra, slots) -> None:
    """LonghaulFlag.NO_REPACK (--no-longhaul-repack): longhaul's slots keep the plain layout where the CPU repacks
    the banks, with no test hook; the resident weights stay repacked. Nothing is converted as experts are read,
    the load log counts no repacked bank, and the output is a normal load's with plain expert banks, to the bit."""
    import logging
    import re

    spec = dataclasses.replace(spec_of(arch, et, extra), weight_type="q4_0")
    path = make_model(**dataclasses.asdict(spec))[0]
    k = spec.n_expert_used
    flags = LonghaulFlag.NO_REPACK | (LonghaulFlag.DIRECT_IO if slots.endswith(" direct") else 0)
    n_slots = {"all": spec.n_expert, "2k": 2 * k, "staged": k - 1}[slots.split()[0]]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        ids, logits, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, n_slots),
                                       longhaul_flags=flags)
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert info["flags"] & LonghaulFlag.NO_REPACK
    st = info["stats"].total
    assert st.n_misses > 0 and st.bytes_converted == 0 and st.t_convert_s == 0
    assert re.search(r"0 of [1-9][0-9]* banks in the CPU's repacked layout", log), log[-2000:]
    ref_ids, ref_logits = reference(path, info["n_ubatch"], bufts="plain_experts")
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)


def test_counters(make_model) -> None:
    spec = spec_of("qwen35moe", "q4_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, spec.n_expert)) as m:
        st = m.longhaul_stats()
        # nothing is read at load, nor at context creation (no warmup)
        assert st.total.bytes_read == 0 and st.total.n_misses == 0 and st.total.n_reads == 0
        assert len(st.layers) == len(spec.moe_layers())
        assert all(layer.expert_bytes == spec.expert_bytes() for layer in st.layers)
        with m.context(n_ctx=512, n_threads=2) as ctx:
            assert m.longhaul_stats().total.bytes_read == 0
            prompt = m.tokenize(PROMPT)
            ctx.decode(prompt)
            first = m.longhaul_stats()
            for layer in first.layers:
                assert layer.bytes_read == layer.n_misses * layer.expert_bytes
                assert layer.n_reads == layer.n_misses * 3  # one read per bank: gate, up, down
                assert 0 < layer.n_misses <= spec.n_expert
                assert layer.n_batches > 0 and layer.n_stages == layer.n_batches
            assert first.total.bytes_read == sum(layer.bytes_read for layer in first.layers)
            # the same prompt again: the cache holds the working set, nothing is read
            ctx.reset()
            ctx.decode(prompt)
            second = m.longhaul_stats()
            assert second.total.bytes_read == first.total.bytes_read
            assert second.total.n_hits > first.total.n_hits
            m.longhaul_stats_reset()
            assert m.longhaul_stats().total.n_hits == 0
            assert m.longhaul_stats().total.n_slots == first.total.n_slots


@pytest.mark.parametrize("n_ubatch", [7, 24])
def test_waves_over_several_ubatches(make_model, caplog, n_ubatch) -> None:
    """A prompt split into ubatches that each select more experts than the cache holds: every ubatch
    runs in expert waves (5 slots of 16: groups of 5, 5, 5, 1), bit-identical to a normal load."""
    import logging

    spec = spec_of("qwen35moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        ids, logits, info = run_greedy(path, n_ubatch, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, 5),
                                       use_extra_bufts=False)
    assert info["n_ubatch"] == n_ubatch
    assert any("expert waves" in r.getMessage() for r in caplog.records)
    k, n_prompt = spec.n_expert_used, info["n_prompt"]
    full, rest = divmod(n_prompt, n_ubatch)
    waves = lambda t: wave_syncs(5, spec.n_expert, k, t)  # noqa: E731
    expect = full * waves(n_ubatch) + (waves(rest) if rest else 0)
    n_prompt_ubatches = full + (1 if rest else 0)
    for layer in info["stats"].layers:
        if layer.il == spec.n_layer - 1:
            continue  # computes only the output rows
        assert layer.n_stages - (layer.n_batches - n_prompt_ubatches) == expect
        assert layer.n_evictions > 0
    ref_ids, ref_logits = reference(path, n_ubatch)
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)


def test_lru_evicts_with_a_small_cache(make_model) -> None:
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, spec.n_expert_used)) as m:
        with m.context(n_ctx=512, n_threads=2) as ctx:
            list(ctx.greedy(m.tokenize(PROMPT), 8))
        st = m.longhaul_stats().total
        assert st.n_evictions > 0
        assert st.n_misses > st.n_slots  # experts were read again after eviction


def test_stats_count_the_cached_experts(make_model) -> None:
    """n_cached is the cache's occupancy: every miss into a free slot adds one (none is lost to a failed read
    here), a full cache stays full, and a reset of the counters keeps it (the slots keep their experts)."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    for slots in (spec.n_expert_used, spec.n_expert):
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, slots)) as m:
            assert m.longhaul_stats().total.n_cached == 0  # nothing is read before the first decode
            with m.context(n_ctx=512, n_threads=2) as ctx:
                list(ctx.greedy(m.tokenize(PROMPT[:12]), 2))
            st = m.longhaul_stats()
            for lay in st.layers:
                assert lay.n_cached == lay.n_misses - lay.n_evictions <= lay.n_slots, lay
                assert lay.n_cached == lay.n_slots or lay.n_evictions == 0
            assert st.total.n_cached == sum(lay.n_cached for lay in st.layers) > 0
            if slots == spec.n_expert:
                assert st.total.n_cached < st.total.n_slots  # a short prompt selects only some experts
            m.longhaul_stats_reset()
            assert m.longhaul_stats().total.n_cached == st.total.n_cached
            assert m.longhaul_stats().total.n_misses == 0


def test_budget_is_required(make_model) -> None:
    path = make_model(arch="qwen3moe")[0]
    with pytest.raises(ValueError, match="give the expert cache budget of LoadMode.LONGHAUL"):
        Model(path, load_mode=LoadMode.LONGHAUL)
    # the library's own check (a C caller that bypasses the Python wrapper)
    from longhaul_cpp._lib import log_mark, raise_error

    p = lib().llama_model_default_params()
    p.load_mode = LoadMode.LONGHAUL
    mark = log_mark()
    assert lib().llama_model_load_from_file(os.fsencode(path), p) == ffi.NULL
    with pytest.raises(LlamaError, match="the cache budget is required"):
        raise_error("refused", mark)


def test_budget_too_small_names_the_minimum(make_model) -> None:
    spec = spec_of("laguna", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    minimum = spec.budget_for(1)
    with pytest.raises(LlamaError, match="less than one expert slot.*minimum budget") as e:
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=minimum - 1)
    assert re.search(r"the minimum budget is [0-9.]+ (B|KiB|MiB)", str(e.value)), str(e.value)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=minimum) as m:
        assert all(layer.n_slots == 1 for layer in m.longhaul_stats().layers)
    # the value it suggests is a size the keyword takes (worded for Python), and it loads (a model below 1 MiB per
    # slot too)
    assert "--longhaul-cache" not in str(e.value)
    suggested = re.search(r"use longhaul_cache='(\S+)' or more", str(e.value)).group(1)
    assert suggested == f"{-(-minimum // 2**20)}MiB"
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=suggested) as m:
        assert all(layer.n_slots >= 1 for layer in m.longhaul_stats().layers)


@pytest.mark.parametrize("param,message", [
    ("vocab_only", "vocabulary-only"), ("check_tensors", "tensor validation"), ("load_mtp", "MTP"),
])
def test_refused_model_params(make_model, param, message) -> None:
    path = make_model(arch="qwen3moe")[0]
    with pytest.raises(LlamaError, match=message):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1, **{param: True})


def test_refused_expert_tensor_override(make_model) -> None:
    """`tensor_buft_overrides` as `{pattern: buffer type name}` (like -ot): none may move the experts."""
    path = make_model(arch="qwen3moe")[0]
    with pytest.raises(LlamaError, match="override 'ffn_.\\*_exps' matches the routed expert tensor"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1, tensor_buft_overrides={"ffn_.*_exps": "CPU"})
    with pytest.raises(ValueError, match="unknown buffer type 'NPU' for tensor pattern 'attn_q'; available: .*CPU"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1, tensor_buft_overrides={"attn_q": "NPU"})
    # an override of other tensors is fine
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1, tensor_buft_overrides={"attn_q": "CPU"}) as m:
        assert m.is_longhaul


def test_refused_embeddings_context(make_model) -> None:
    path = make_model(arch="qwen3moe")[0]
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1) as m:
        with pytest.raises(LlamaError, match="embeddings are not supported"):
            m.context(embeddings=True)


def test_truncated_shard_fails_the_decode_not_the_process(make_model, tmp_path) -> None:
    spec = spec_of("qwen3moe", "q8_0", {})
    paths = make_model(n_shards=3, **dataclasses.asdict(spec))
    for p in paths:
        shutil.copy(p, tmp_path / p.name)
    first = tmp_path / paths[0].name
    budget = budget_for(spec, spec.n_expert)
    ref, _, info = run_greedy(paths[0], 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    with Model(first, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m:
        with m.context(n_ctx=512, n_threads=2, n_ubatch=info["n_ubatch"]) as ctx:
            # cut the shards after load: expert reads from them come up short
            for p in paths[1:]:
                with open(tmp_path / p.name, "r+b") as f:
                    f.truncate(1024)
            with pytest.raises(LlamaError, match="short read from .*gguf at offset"):
                ctx.decode(m.tokenize(PROMPT))
            # restore the files in place (same inodes): the slots that failed must be read again,
            # never used as hits, so the output equals a clean run
            for p in paths[1:]:
                shutil.copy(p, tmp_path / p.name)
            ctx.reset()
            assert list(ctx.greedy(m.tokenize(PROMPT), N_GEN)) == ref


def test_failed_read_is_retried_once(make_model) -> None:
    """A read that fails once (failing_read(N) injects an error into the N-th read) is read again: the decode
    succeeds, the output is a clean run's, and the stats count the retry."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, spec.n_expert)
    ref, _, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    with failing_read(5):
        ids, _, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    assert ids == ref
    st = info["stats"].total
    # the slices of the failed read are read again: whole experts (gate, up, down); one expert's 3 slices
    # with buffered reads (no memory limit here), the adjacent experts read together with it with O_DIRECT
    assert st.n_retries > 0 and st.n_retries % 3 == 0 and st.n_reads == st.n_misses * 3 + st.n_retries
    assert st.n_retries == 3 or info["flags"] & LonghaulFlag.DIRECT_IO


@pytest.mark.parametrize("slots", ["all", "k"])
def test_failed_read_fails_the_decode_and_says_why(make_model, tmp_path, slots) -> None:
    """A read that fails twice fails the decode: LlamaError and llama_model_longhaul_error carry the file
    and offset; the syncs after the failed one read nothing; the next decode starts clean. Also when the
    prompt runs in pipelined expert waves (k slots), whose reads fail while a wave computes."""
    spec = spec_of("qwen3moe", "q8_0", {})
    paths = make_model(n_shards=3, **dataclasses.asdict(spec))
    for p in paths:
        shutil.copy(p, tmp_path / p.name)
    budget = budget_for(spec, spec.n_expert if slots == "all" else spec.n_expert_used)
    flags = LonghaulFlag.PIPELINE if slots == "k" else LonghaulFlag(0)
    with Model(tmp_path / paths[0].name, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, longhaul_flags=flags) as m:
        with m.context(n_ctx=512, n_threads=2) as ctx:
            assert m.longhaul_error() == ""
            for p in paths[1:]:
                with open(tmp_path / p.name, "r+b") as f:
                    f.truncate(1024)
            with pytest.raises(LlamaError, match="short read from .*gguf at offset [0-9]+"):
                ctx.decode(m.tokenize(PROMPT))
            assert "short read from" in m.longhaul_error()
            layers = m.longhaul_stats().layers
            failed = next(i for i, lay in enumerate(layers) if lay.n_retries > 0)
            if slots == "all":  # one read of all the layer's experts
                assert layers[failed].n_reads > 0 and layers[failed].bytes_read == 0
            assert all(lay.n_reads == 0 for lay in layers[failed + 1:])  # no reads after the failure
            for p in paths[1:]:
                shutil.copy(p, tmp_path / p.name)
            ctx.reset()
            ids = list(ctx.greedy(m.tokenize(PROMPT), N_GEN))
            assert m.longhaul_error() == ""  # cleared when a decode starts
    ref, _, _ = run_greedy(tmp_path / paths[0].name, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    assert ids == ref  # nothing of the failed decode is used (slots of failed reads are never hits)


def test_failed_read_in_a_pipelined_wave_is_retried(make_model) -> None:
    """A read that fails while an expert wave computes (the next wave's, started by the wave's sync) is
    retried when the next wave's sync waits for it: the output is a clean run's."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, spec.n_expert_used)  # waves of k / 2 experts: wave 0 reads 2 x 3 slices at once
    kw = dict(load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, longhaul_flags=LonghaulFlag.PIPELINE)
    ref, _, _ = run_greedy(path, 512, **kw)
    with failing_read(8):  # in wave 1's reads, started while wave 0 computes
        ids, _, info = run_greedy(path, 512, **kw)
    assert ids == ref
    st = info["stats"].total
    assert st.n_retries > 0 and st.t_hidden_s > 0


def test_missing_shard_fails_the_load(make_model, tmp_path) -> None:
    spec = spec_of("laguna", "q8_0", {})
    paths = make_model(n_shards=3, **dataclasses.asdict(spec))
    for p in paths[:2]:
        shutil.copy(p, tmp_path / p.name)
    with pytest.raises(LlamaError, match="failed to load model"):
        Model(tmp_path / paths[0].name, load_mode=LoadMode.LONGHAUL, longhaul_cache=1)


def test_two_contexts_share_the_cache_safely(make_model) -> None:
    """Two contexts on one longhaul model decode in turns, token by token, evicting each other's
    experts (8 of 16 slots): each gets exactly what it gets alone."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, 8)
    prompt_b = "another prompt, other experts " * 4
    ref_a, _, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    ref_b, _, _ = run_greedy(path, 512, prompt_b, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    assert ref_a != ref_b
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m:
        a = m.context(n_ctx=512, n_threads=2, n_ubatch=info["n_ubatch"])
        b = m.context(n_ctx=512, n_threads=2, n_ubatch=info["n_ubatch"])
        ga = a.greedy(m.tokenize(PROMPT), N_GEN)
        gb = b.greedy(m.tokenize(prompt_b), N_GEN)
        ids_a, ids_b = [], []
        for ta, tb in zip(ga, gb):  # interleave the two decodes token by token
            ids_a.append(ta)
            ids_b.append(tb)
        assert m.longhaul_stats().total.n_evictions > 0
    n = min(len(ref_a), len(ref_b))
    assert ids_a == ref_a[:n] and ids_b == ref_b[:n] and n > 0


def test_cache_size_parsing() -> None:
    assert parse_cache_size(2) == 2 * 2**30
    assert parse_cache_size(0.5) == 2**29
    assert parse_cache_size("512MiB") == 512 * 2**20
    assert parse_cache_size("2GiB") == 2 * 2**30
    assert parse_cache_size("1.5") == int(1.5 * 2**30)
    assert parse_cache_size("1000B") == 1000
    assert parse_cache_size(2**33 - 1) == (2**33 - 1) * 2**30
    for bad in ("", "abc", "-1", "0", "2 parsecs", 0, -3, True, float("nan"), float("inf"), 2**33, 1e300,
                "9EiB", "1e30GiB", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_cache_size(bad)


def test_refused_eval_callback(make_model) -> None:
    """An eval callback (llama-imatrix, llama-eval-callback) would see slot ids in the expert matmuls."""
    path = make_model(arch="qwen3moe")[0]
    seen = []
    cb = ffi.callback("ggml_backend_sched_eval_callback", lambda t, ask, ud: seen.append(1) or True)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1) as m:
        with pytest.raises(LlamaError, match="eval callback .*would see cache slot ids.*without longhaul"):
            m.context(cb_eval=cb)
    with Model(path, load_mode=LoadMode.NONE) as m, m.context(cb_eval=cb) as ctx:  # a normal load takes it
        ctx.decode(m.tokenize("x"))
    assert seen


def test_refused_save(make_model, tmp_path, caplog) -> None:
    """llama_model_save_to_file: a longhaul model holds slots, not its experts; nothing is written."""
    import logging

    path = make_model(arch="qwen3moe")[0]
    with caplog.at_level(logging.ERROR, logger="longhaul_cpp.llama"):
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1) as m:
            lib().llama_model_save_to_file(m.ptr, str(tmp_path / "lh.gguf").encode())
        with Model(path, load_mode=LoadMode.NONE) as m:
            lib().llama_model_save_to_file(m.ptr, str(tmp_path / "normal.gguf").encode())
    assert not (tmp_path / "lh.gguf").exists() and (tmp_path / "normal.gguf").stat().st_size > 0
    assert any("load it without longhaul to save it" in r.getMessage() for r in caplog.records)


def test_load_mode_name_round_trip() -> None:
    L = lib()
    assert ffi.string(L.llama_load_mode_name(LoadMode.LONGHAUL.value)) == b"longhaul"
    assert L.llama_load_mode_from_str(b"longhaul") == LoadMode.LONGHAUL.value


RSS_SCRIPT = r"""
import sys
from longhaul_cpp import LoadMode, Model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

path, budget = sys.argv[1], sys.argv[2]
import longhaul_cpp; longhaul_cpp.lib()  # load the library before the baseline
base = status("VmRSS")
with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m:
    with m.context(n_ctx=512, n_threads=2) as ctx:
        for rep in range(3):
            ctx.reset()
            list(ctx.greedy(m.tokenize("a long generation, " * 8), 200))
        print(status("VmRSS") - base, status("VmHWM") - base, m.longhaul_stats().total.bytes_read)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_rss_stays_within_resident_weights_plus_budget(make_model, tmp_path) -> None:
    """Measured from /proc in a fresh process; the experts (104 MiB) are far larger than the bound."""
    import subprocess
    import sys

    spec = SyntheticSpec(arch="qwen3moe", n_embd=256, n_expert=128, n_expert_used=4, n_ff_exp=256,
                         expert_type="q8_0", weight_type="q8_0")
    path = make_model(**dataclasses.asdict(spec))[0]
    expert_total = spec.budget_for(spec.n_expert)
    resident = path.stat().st_size - expert_total
    budget = spec.budget_for(8)
    r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path), f"{budget}B"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rss, hwm, bytes_read = (int(x) for x in r.stdout.split())
    assert bytes_read > expert_total  # the whole expert set went through the cache, more than once
    margin = 24 * 2**20  # KV cache (512 cells, 4 layers), compute buffers, allocator slack
    assert rss <= resident + budget + margin, (rss, resident, budget)
    assert hwm <= resident + budget + margin, (hwm, resident, budget)
    assert expert_total > 2 * (resident + budget + margin)  # the bound is meaningfully below a full load


@pytest.mark.parametrize("arch,et,extra", [("qwen3moe", "q4_0", {}), ("qwen35moe", "q8_0", {"merged_gate_up": True}),
                                           ("laguna", "f16", {})])
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("slots", ["all", "waves", "staged"])
def test_forced_staged_writes_equal_normal_load(make_model, caplog, arch, et, extra, shards, slots) -> None:
    """LonghaulFlag.STAGED: slices go through the staging buffer and ggml_backend_tensor_set()."""
    import logging

    spec = spec_of(arch, et, extra)
    paths = make_model(n_shards=shards, **dataclasses.asdict(spec))
    n_slots = {"all": spec.n_expert, "waves": spec.n_expert_used + 1, "staged": spec.n_expert_used - 1}[slots]
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        ids, logits, info = run_greedy(paths[0], 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, n_slots),
                                       use_extra_bufts=False, longhaul_flags=LonghaulFlag.STAGED)
    assert any("written through staging buffers" in r.getMessage() for r in caplog.records)
    assert info["stats"].total.n_misses > 0
    ref_ids, ref_logits = reference(paths[0], info["n_ubatch"])
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)


def test_direct_writes_by_default(make_model, caplog) -> None:
    import logging

    path = make_model(arch="qwen3moe")[0]
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1).close()
    assert not any("staging" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_two_pass_decode_overlaps_reads_and_changes_nothing(make_model, arch) -> None:
    """Decode runs each routed layer in two passes: the cached experts compute while the missing ones are
    read. The same ids and logits as one-pass syncs (LonghaulFlag.NO_OVERLAP), bit for bit, and the
    library counts read time hidden behind compute only when the passes run."""
    spec = spec_of(arch, "q4_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, 2 * spec.n_expert_used)  # generation keeps missing some experts
    no_pipe = LonghaulFlag.NO_PIPELINE  # the prompt's waves hide nothing
    ids, logits, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, longhaul_flags=no_pipe)
    ids0, logits0, info0 = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget,
                                      longhaul_flags=no_pipe | LonghaulFlag.NO_OVERLAP)
    assert ids == ids0
    np.testing.assert_array_equal(logits, logits0)
    st, st0 = info["stats"].total, info0["stats"].total
    assert st.n_misses == st0.n_misses and st.bytes_read == st0.bytes_read  # the same plan, pass by pass
    assert st.t_hidden_s > 0 and st0.t_hidden_s == 0
    assert st.n_stages == st0.n_stages  # the two passes are one synchronization


@pytest.mark.parametrize("arch", ["qwen3moe", "inkling"])
@pytest.mark.parametrize("slots", ["2k", "k"])
def test_pipelined_waves_overlap_reads_and_change_nothing(make_model, arch, slots) -> None:
    """A prompt in expert waves: each wave's sync starts reading the next wave's missing experts, which
    then load while the wave computes. The same ids and logits as waves that read when they start
    (LonghaulFlag.NO_PIPELINE), bit for bit; read time is hidden only when pipelined; every expert a wave
    needs is read once either way."""
    spec = spec_of(arch, "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    k = spec.n_expert_used
    budget = budget_for(spec, {"2k": 2 * k, "k": k}[slots])
    results = {}
    for pipeline in ("1", "0"):
        # no two-pass decode: only the waves hide reads
        flags = LonghaulFlag.NO_OVERLAP | (LonghaulFlag.PIPELINE if pipeline == "1" else LonghaulFlag.NO_PIPELINE)
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, use_extra_bufts=False,
                   longhaul_flags=flags) as m, \
                m.context(n_ctx=512, n_threads=2) as ctx:
            prompt = m.tokenize(PROMPT)
            ctx.decode(prompt)  # one ubatch, in waves
            logits = ctx.logits().copy()
            st = m.longhaul_stats()
        results[pipeline] = (logits, st)
    (logits1, st1), (logits0, st0) = results["1"], results["0"]
    np.testing.assert_array_equal(logits1, logits0)
    n_prompt = len(prompt)
    for layer1, layer0 in zip(st1.layers, st0.layers):
        if layer1.il == spec.n_layer - 1:
            continue  # some archs compute only the output row there: one token, no waves
        assert layer1.n_stages == wave_syncs(layer1.n_slots, spec.n_expert, k, n_prompt, pipelined=True)
        assert layer0.n_stages == wave_syncs(layer0.n_slots, spec.n_expert, k, n_prompt)
        # a cold cache: every distinct expert of the ubatch is read once, in both plans
        assert layer1.n_misses == layer0.n_misses <= spec.n_expert and layer1.n_hits == layer0.n_hits == 0
    assert st1.total.t_hidden_s > 0 and st0.total.t_hidden_s == 0
    # and the whole run (prompt, then decode with its two passes) equals a normal load
    # (pipelined as under a memory limit, where the reads bypass the page cache)
    ref_ids, ref_logits = reference(path, 512)
    ids, logits, _ = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, use_extra_bufts=False,
                                longhaul_flags=LonghaulFlag.PIPELINE)
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)


def test_pipelined_waves_plan_each_expert_once(make_model) -> None:
    """A warm prompt in pipelined waves: its cached experts run first, in waves that read nothing. Every distinct
    expert of the ubatch is counted once, hit or miss, as in the cold run of the same prompt (a wave of hits was
    counted by the sync before it, which planned it with its own wave, and again by its own), and what is read
    is what the cold run did not keep."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    flags = LonghaulFlag.NO_OVERLAP | LonghaulFlag.PIPELINE  # only the waves read
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, 2 * spec.n_expert_used),
               use_extra_bufts=False, longhaul_flags=flags) as m, m.context(n_ctx=512, n_threads=2) as ctx:
        prompt = m.tokenize(PROMPT)
        ctx.decode(prompt)  # cold: every distinct expert is a miss
        cold = m.longhaul_stats()
        ctx.reset()
        ctx.decode(prompt)  # the same routing, warm
        warm = m.longhaul_stats()
    n_hit_layers = 0
    for c, w in zip(cold.layers, warm.layers):
        if c.il == spec.n_layer - 1:
            continue  # some archs compute only the output row there
        assert c.n_hits == 0 and c.n_misses > 2 * spec.n_expert_used  # more experts than slots: waves
        hits, misses = w.n_hits - c.n_hits, w.n_misses - c.n_misses
        assert hits + misses == c.n_misses  # the ubatch's distinct experts, each once
        assert 0 < hits <= c.n_slots and (w.bytes_read - c.bytes_read) == misses * c.expert_bytes
        n_hit_layers += 1
    assert n_hit_layers > 0


@pytest.mark.parametrize("direct", ["1", "0"])
def test_waves_are_pipelined_when_reads_bypass_the_page_cache(make_model, caplog, direct) -> None:
    """Without a pipeline flag the waves are pipelined exactly when the shards are read with O_DIRECT
    (forced here; a file system that refuses O_DIRECT falls back to the page cache, and then they are not):
    the load log says which, and only pipelined waves hide prompt reads. The cross-layer prefetch of decode
    follows the same rule without its flag."""
    import logging
    import re

    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    # no two-pass decode: only waves could hide reads
    flags = LonghaulFlag.NO_OVERLAP | (LonghaulFlag.DIRECT_IO if direct == "1" else LonghaulFlag.NO_DIRECT_IO)
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, spec.n_expert_used),
                   longhaul_flags=flags) as m, m.context(n_ctx=512, n_threads=2) as ctx:
            ctx.decode(m.tokenize(PROMPT))  # one ubatch, in waves
            hidden = m.longhaul_stats().total.t_hidden_s
            in_effect = m.longhaul_flags
    n_direct = int(re.search(r"longhaul: ([0-9]+) of [0-9]+ shard\(s\) read with O_DIRECT", caplog.text).group(1))
    assert n_direct == (1 if direct == "1" else 0)  # the models' folder takes O_DIRECT (conftest.model_dir)
    pipelined = n_direct > 0
    assert ("expert waves read the next wave's experts while they compute" in caplog.text) == pipelined
    assert ("expert waves read their experts when they start" in caplog.text) == (not pipelined)
    assert (hidden > 0) == pipelined
    # the library reports its choices: direct I/O as the flag asked (or refused by the file system), waves to match
    assert in_effect & LonghaulFlag.NO_OVERLAP
    assert bool(in_effect & LonghaulFlag.DIRECT_IO) == pipelined and bool(in_effect & LonghaulFlag.NO_DIRECT_IO) != pipelined
    assert bool(in_effect & LonghaulFlag.PIPELINE) == pipelined and bool(in_effect & LonghaulFlag.NO_PIPELINE) != pipelined
    # the prefetch follows O_DIRECT too, but its reads complete inside two-pass syncs, which NO_OVERLAP turns off: it
    # is off, and where it would have been on the log says why
    assert in_effect & LonghaulFlag.NO_PREFETCH and not in_effect & LonghaulFlag.PREFETCH
    assert "cross-layer prefetch on for" not in caplog.text
    assert ("cross-layer prefetch off: two-pass syncs are off" in caplog.text) == pipelined


def test_prefetch_switch_overrides_the_default(make_model) -> None:
    """PREFETCH and NO_PREFETCH override the library's choice either way (on with reads through the page cache,
    off with O_DIRECT), decode reads ahead only when on, and the two together are refused with the pair named."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, 2 * spec.n_expert_used)
    for flags, on in ((LonghaulFlag.NO_DIRECT_IO | LonghaulFlag.PREFETCH, True),
                      (LonghaulFlag.DIRECT_IO | LonghaulFlag.NO_PREFETCH, False)):
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget, longhaul_flags=flags) as m, \
                m.context(n_ctx=512, n_threads=2) as ctx:
            assert bool(m.longhaul_flags & LonghaulFlag.PREFETCH) == on
            assert bool(m.longhaul_flags & LonghaulFlag.NO_PREFETCH) == (not on)
            list(ctx.greedy(m.tokenize(PROMPT), 12, stop_at_eog=False))
            assert (m.longhaul_stats().total.bytes_prefetched > 0) == on
    with pytest.raises(LlamaError, match="PREFETCH and NO_PREFETCH"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget,
              longhaul_flags=LonghaulFlag.PREFETCH | LonghaulFlag.NO_PREFETCH)


@pytest.mark.parametrize("asked", [False, True])
def test_prefetch_is_off_where_it_cannot_run(make_model, caplog, asked) -> None:
    """gpt-oss's per-expert biases keep each decode step's sync in one pass, where the prefetch cannot complete: with
    O_DIRECT (where it is on by default), and even when asked for, the flags in effect say off, the load log says
    why, and decode reads nothing ahead."""
    import logging

    spec = spec_of("gpt-oss", "mxfp4", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    flags = LonghaulFlag.DIRECT_IO | (LonghaulFlag.PREFETCH if asked else LonghaulFlag(0))
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, 2 * spec.n_expert_used),
                   longhaul_flags=flags) as m, m.context(n_ctx=512, n_threads=2) as ctx:
            assert m.longhaul_flags & LonghaulFlag.DIRECT_IO
            assert m.longhaul_flags & LonghaulFlag.NO_PREFETCH and not m.longhaul_flags & LonghaulFlag.PREFETCH
            list(ctx.greedy(m.tokenize(PROMPT), 8, stop_at_eog=False))
            assert m.longhaul_stats().total.bytes_prefetched == 0
    assert "cross-layer prefetch off" in caplog.text and "per-expert biases" in caplog.text
    assert ("although asked for" in caplog.text) == asked


def test_failed_read_in_flight_is_retried(make_model) -> None:
    """A read that fails while the cached experts compute (a decode step's two-pass sync) is retried
    when the second pass waits for it: the output is a clean run's."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = budget_for(spec, spec.n_expert_used)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m, m.context(n_ctx=512, n_threads=2) as ctx:
        ctx.decode(m.tokenize(PROMPT))
        n_prompt_reads = m.longhaul_stats().total.n_reads
    ref, _, _ = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    with failing_read(n_prompt_reads + 2):  # in the first generation step
        ids, _, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    assert ids == ref
    assert info["stats"].total.n_retries == 3 and info["stats"].total.t_hidden_s > 0


PREFETCH_TYPES = [("qwen3moe", "q8_0", {}), ("qwen35moe", "q4_0", {"merged_gate_up": True}), ("laguna", "f32", {}),
                  ("inkling", "q8_0", {})]


@pytest.mark.parametrize("arch,et,extra", PREFETCH_TYPES, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("slots", ["2k", "3k/2", "k", "staged"])
def test_prefetch_changes_no_output(make_model, arch, et, extra, shards, slots) -> None:
    """The cross-layer prefetch (LonghaulFlag.PREFETCH) reads the experts the next layer's router ranks
    highest on a layer's input while that layer computes: token ids and logits stay those of a normal load.
    It prefetches in decode steps only, into at most n_slots - k slots (none with k slots or fewer), never in
    the first routed layer; every prefetched byte is counted once as used or wasted."""
    spec = spec_of(arch, et, extra)
    paths = make_model(n_shards=shards, **dataclasses.asdict(spec))
    k = spec.n_expert_used
    n_slots = {"2k": 2 * k, "3k/2": 3 * k // 2, "k": k, "staged": k - 1}[slots]
    kw = dict(load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, n_slots), use_extra_bufts=False,
              longhaul_flags=LonghaulFlag.PREFETCH)
    ids, logits, info = run_greedy(paths[0], 512, **kw)
    ref_ids, ref_logits = reference(paths[0], info["n_ubatch"])
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)
    st = info["stats"]
    assert st.layers[0].bytes_prefetched == 0  # nothing before the first routed layer predicts it
    for lay in st.layers:
        assert lay.bytes_prefetched == lay.bytes_prefetch_used + lay.bytes_prefetch_wasted
        assert lay.bytes_prefetched <= max(0, n_slots - k) * lay.expert_bytes * N_GEN  # the reserve, per decode step
        assert lay.bytes_prefetched <= lay.bytes_read
        # a layer reads what its synchronizations miss and what the prefetch reads ahead, nothing else: the
        # recall (used / (used + missed)) compares the two parts of bytes_read
        assert lay.bytes_read == lay.bytes_missed + lay.bytes_prefetched
        assert lay.prefetch_recall == (lay.bytes_prefetch_used / (lay.bytes_prefetch_used + lay.bytes_missed)
                                       if lay.bytes_prefetch_used + lay.bytes_missed else 0.0)
    used, missed = sum(l.bytes_prefetch_used for l in st.layers), sum(l.bytes_missed for l in st.layers)
    assert st.prefetch_recall == pytest.approx(used / (used + missed) if used + missed else 0.0)
    assert 0.0 <= st.prefetch_recall <= 1.0
    if n_slots > k:
        # the prefetch's reads race the next layer's sync, which drops the reads no reader has started: on a
        # loaded machine one run can lose every race, so a few more runs get their chance to read ahead
        for _ in range(4):
            if st.total.bytes_prefetched > 0:
                break
            st = run_greedy(paths[0], 512, **kw)[2]["stats"]
        assert st.total.bytes_prefetched > 0
    else:
        assert st.total.bytes_prefetched == 0


@pytest.mark.parametrize("arch,et,extra", PREFETCH_TYPES[:2], ids=lambda v: v if isinstance(v, str) else "")
def test_prefetch_in_small_ubatches(make_model, arch, et, extra) -> None:
    """Ubatches of 2 tokens run in two passes and prefetch too: a layer's 2k experts and the slots its detached
    prefetch is still writing may not fit together, and then its hits pass waits for them first; a prompt ubatch
    without outputs skips the last layer's MoE, whose prefetch the next sync then drops (both happen here,
    checked with a debug print). Token ids and logits stay those of a normal load with the same ubatch."""
    spec = spec_of(arch, et, extra)
    path = make_model(**dataclasses.asdict(spec))[0]
    ids, logits, info = run_greedy(path, 2, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, 2 * spec.n_expert_used),
                                   use_extra_bufts=False, longhaul_flags=LonghaulFlag.PREFETCH)
    assert info["n_ubatch"] == 2
    ref_ids, ref_logits = reference(path, 2)
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)
    st = info["stats"].total
    assert st.bytes_prefetched > 0 and st.bytes_prefetched == st.bytes_prefetch_used + st.bytes_prefetch_wasted


def test_prefetch_is_off_through_the_page_cache(make_model, caplog) -> None:
    """Without a prefetch flag, reads through the page cache do not prefetch (a copy has no device time to hide;
    with O_DIRECT they do: test_waves_are_pipelined_when_reads_bypass_the_page_cache)."""
    import logging

    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        _, _, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL,
                                longhaul_cache=budget_for(spec, 2 * spec.n_expert_used),
                                longhaul_flags=LonghaulFlag.NO_DIRECT_IO)
    assert info["stats"].total.bytes_prefetched == 0
    assert "cross-layer prefetch off" in caplog.text and "cross-layer prefetch on" not in caplog.text


def test_failed_prefetch_read_is_retried(make_model) -> None:
    """A read of the prefetch that fails (the first one of the second routed layer's prefetch in the first
    generation step) is retried when that layer's sync waits for it: the output is a clean run's."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    kw = dict(load_mode=LoadMode.LONGHAUL, longhaul_cache=budget_for(spec, 2 * spec.n_expert_used),
              longhaul_flags=LonghaulFlag.PREFETCH)
    ref, _, _ = run_greedy(path, 512, **kw)
    # the prefetch's reads race the next layer's sync (which drops the reads no reader has started): tries, each
    # checked, until the second layer's prefetch read something in the first step; CI's background builds (Windows,
    # Vulkan, the sanitizers) load the cores enough that 5 were once not enough
    retried = False
    for _ in range(20):
        with Model(path, **kw) as m, \
                m.context(n_ctx=512, n_threads=2) as ctx:
            prompt = m.tokenize(PROMPT)
            ctx.decode(prompt)
            n_prompt_reads = m.longhaul_stats().total.n_reads
            m.longhaul_stats_reset()
            ctx.decode([int(np.argmax(ctx.logits()))])
            step = m.longhaul_stats().layers
        if step[1].bytes_prefetched == 0:
            continue
        # read calls: the prompt's, the first layer's in the step, then the second layer's prefetch
        with failing_read(n_prompt_reads + step[0].n_reads + 1):
            ids, _, info = run_greedy(path, 512, **kw)
        assert ids == ref  # whatever read the injected error hit
        if info["stats"].layers[1].n_retries > 0 and info["stats"].total.n_retries == 3:
            retried = True
            break
    assert retried, "the second layer's prefetch never read first, or its failed read was not retried"


def test_stats_fill_no_more_than_the_callers_struct(make_model) -> None:
    """llama_model_longhaul_stats takes the caller's sizeof: a caller built before fields were appended (here: the
    struct without the prefetch counters) gets its fields, and nothing is written past them; size 0 is refused."""
    path = make_model(arch="qwen3moe")[0]
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1) as m, m.context(n_ctx=256) as ctx:
        ctx.decode(m.tokenize(PROMPT))
        full = m.longhaul_stats().total
        cut = ffi.offsetof("struct llama_longhaul_stats", "bytes_prefetched")
        size = ffi.sizeof("struct llama_longhaul_stats")
        buf = ffi.new("char[]", size)
        ffi.memmove(buf, b"\xab" * size, size)
        st = ffi.cast("struct llama_longhaul_stats *", buf)
        assert lib().llama_model_longhaul_stats(m.ptr, -1, st, cut)
        assert full.n_misses > 0 and st.n_misses == full.n_misses and st.bytes_read == full.bytes_read
        assert ffi.buffer(buf)[cut:] == b"\xab" * (size - cut)
        assert not lib().llama_model_longhaul_stats(m.ptr, -1, st, 0)


@pytest.mark.parametrize("policy", ["LFU", "ADAPTIVE"])
@pytest.mark.parametrize("slots", ["all", "3k/2", "k", "staged", "1"])
def test_lfu_is_bit_exact(make_model, slots, policy) -> None:
    """The opt-in LFU replacement (LonghaulFlag.LFU, --longhaul-policy lfu) and the adaptive one (ADAPTIVE) change
    which experts stay, never the output: every expert, expert waves, k slots, stages and one slot, against a
    normal load bit for bit; LFU's misses differ from LRU's where there is a choice (the flag is honoured), and
    equal them where there is none."""
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    k = spec.n_expert_used
    n_slots = {"all": spec.n_expert, "3k/2": 3 * k // 2, "k": k, "staged": k - 1, "1": 1}[slots]
    misses = {}
    for flags in (LonghaulFlag[policy], LonghaulFlag(0)):
        ids, logits, info = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, use_extra_bufts=False,
                                       longhaul_cache=budget_for(spec, n_slots), longhaul_flags=flags)
        assert info["flags"] & (LonghaulFlag.LFU | LonghaulFlag.ADAPTIVE) == flags
        misses[flags] = [layer.n_misses for layer in info["stats"].layers]
        ref_ids, ref_logits = reference(path, info["n_ubatch"])
        assert ids == ref_ids
        np.testing.assert_array_equal(logits, ref_logits)
    if slots in ("all", "k", "1"):  # nothing is replaced, or every plan needs every slot: no choice to make
        assert misses[LonghaulFlag[policy]] == misses[LonghaulFlag(0)]
    elif slots == "3k/2" and policy == "LFU":  # decode keeps k of 3k/2 slots: the policies choose differently
        assert misses[LonghaulFlag.LFU] != misses[LonghaulFlag(0)]


@pytest.mark.parametrize("policy", ["lru", "lfu", "adaptive"])
def test_per_layer_slots_are_honoured_bit_exact_and_replayed(make_model, policy) -> None:
    """longhaul_layer_slots instead of the even split: each routed layer gets its own slots (all, k, fewer than k,
    one: stages and one token at a time in one model), with LRU and with the opt-in LFU: the output is a normal
    load's bit for bit, and the planner's replay of that policy at each layer's slots gives the library's misses."""
    from longhaul_cpp.modelinfo import inspect_model
    from longhaul_cpp.plan import replay_lru
    from longhaul_cpp.plan.policies import POLICIES, policy_flags
    from longhaul_cpp.plan.record import record_routing

    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    info = inspect_model(path)
    k, routed = spec.n_expert_used, sorted(info.expert_bytes)
    want = {il: (spec.n_expert, k, k - 1, 1)[i % 4] for i, il in enumerate(routed)}
    budget = sum(want[il] * info.expert_bytes[il] for il in routed)
    flags = policy_flags(policy)
    ids, logits, run = run_greedy(path, 512, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget,
                                  longhaul_layer_slots=want, use_extra_bufts=False, longhaul_flags=flags)
    assert run["flags"] & (LonghaulFlag.LFU | LonghaulFlag.ADAPTIVE) == flags
    st = run["stats"]
    assert {layer.il: layer.n_slots for layer in st.layers} == want
    assert sum(layer.cache_bytes for layer in st.layers) == budget
    assert run["n_ubatch"] == 1  # a layer with fewer slots than a token's experts: one token at a time
    ref_ids, ref_logits = reference(path, 1)
    assert ids == ref_ids
    np.testing.assert_array_equal(logits, ref_logits)
    with Model(path, vocab_only=True) as m:
        prompt = m.tokenize(PROMPT)
    routing = record_routing(path, prompt, ids, n_ubatch=1, n_ctx=512, n_batch=512)
    calls = [len(prompt)] + [1] * len(ids)
    for layer in st.layers:
        toks = routing.layers[layer.il]
        lc = calls if len(toks) == sum(calls) else [1] * len(toks)
        got = int(replay_lru(toks, lc, layer.n_slots, spec.n_expert, 1, cache=POLICIES[policy])[0].sum())
        assert got == layer.n_misses, layer.il


def test_per_layer_slots_are_checked(make_model) -> None:
    spec = spec_of("qwen3moe", "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    from longhaul_cpp.modelinfo import inspect_model
    info = inspect_model(path)
    routed = sorted(info.expert_bytes)
    lh = dict(load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=4 * len(routed) * info.expert_bytes[routed[0]])
    with pytest.raises(LlamaError, match="take .* more than the expert cache budget"):
        Model(path, longhaul_layer_slots={il: 8 for il in routed}, **lh)
    with pytest.raises(LlamaError, match=f"give layer {routed[0]} 0 slots: use 1 to 16"):
        Model(path, longhaul_layer_slots={il: 1 for il in routed[1:]}, **lh)
    with pytest.raises(LlamaError, match="per-layer slots give 2 layers, the model has"):
        Model(path, longhaul_layer_slots=[1, 1], **lh)
    with pytest.raises(ValueError, match="only used with load_mode=LoadMode.LONGHAUL"):
        Model(path, longhaul_layer_slots={routed[0]: 1})
