"""The MoE families people download, as full synthetic models (32 experts, top-4, each family's own parts: see
longhaul_cpp.models.families): gpt-oss (MXFP4 experts, per-expert biases, sinks, SWA), deepseek2 (latent
attention, a leading dense block, a shared expert, sigmoid gating with a selection bias, grouped top-k, a NextN
block), glm4moe (q/k/v biases, partial RoPE, a NextN block), llama4 (MoE every other block, a shared expert) and
Mixtral-style llama.

- single file and split in three shards, a longhaul load equals the normal load (every prompt position's logits
  and the greedy tokens bit for bit, at the same ubatch) with every expert cached, 2k, k, k-1 and 1 slot
  (one pass, waves, stages), and with the cross-layer prefetch;
- the routing record of each replays to the library's own misses at other budgets (the planner's input);
- `auto` sizes each from the library's dry runs and the load runs.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp import LoadMode, LonghaulFlag, Model, SyntheticSpec
from longhaul_cpp.fit import fit_longhaul_cache
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.plan import record_run, replay
from longhaul_cpp.models.families import FAMILIES

from conftest import logits_and_greedy

BASE = dict(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_expert=32, n_expert_used=4, n_ff_exp=64, n_ff=128,
            expert_type="q4_0")
SPECS = {
    "gpt-oss": SyntheticSpec(arch="gpt-oss", **{**BASE, "expert_type": "mxfp4"}, n_embd_head=32, n_swa=8),
    "deepseek2": SyntheticSpec(arch="deepseek2", **BASE, n_expert_group=4, n_group_used=2, n_nextn=1),
    "glm4moe": SyntheticSpec(arch="glm4moe", **BASE, n_nextn=1),
    "llama4": SyntheticSpec(arch="llama4", **BASE, moe_every=2),
    "llama": SyntheticSpec(arch="llama", **BASE),
}
N_PROMPT, N_GEN, N_UBATCH = 40, 8, 32


def test_every_family_has_a_spec() -> None:
    assert sorted(SPECS) == sorted(FAMILIES)


@pytest.fixture(scope="module")
def family_model(make_model):
    made: dict[tuple[str, int], Path] = {}

    def get(arch: str, shards: int = 1) -> Path:
        if (arch, shards) not in made:
            made[(arch, shards)] = make_model(n_shards=shards, **dataclasses.asdict(SPECS[arch]))[0]
        return made[(arch, shards)]

    return get


def _logits(path: Path, n_ubatch: int, **kw) -> tuple[list[int], np.ndarray, int]:
    with Model(path, **kw) as m, m.context(n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_threads=2) as ctx:
        eff = ctx.n_ubatch
        ids, rows = logits_and_greedy(ctx, np.random.default_rng(1).integers(3, m.n_vocab, N_PROMPT), N_GEN)
    return ids, rows, eff


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("arch", list(SPECS))
def test_family_equals_normal_load(family_model, arch, shards) -> None:
    path = family_model(arch, shards)
    info = inspect_model(path)
    spec = SPECS[arch]
    assert sorted(info.expert_bytes) == spec.moe_layers(), "the NextN block's experts are not streamed"
    assert len(info.shards) == shards
    if shards > 1:  # routed banks in more than one shard
        import gguf

        holders = [i for i, s in enumerate(info.shards) if any("_exps." in t.name for t in gguf.GGUFReader(s).tensors)]
        assert len(holders) > 1, holders
    k = spec.n_expert_used
    normal: dict[int, tuple[list[int], np.ndarray]] = {}
    runs = [("all", spec.n_expert, False), ("2k", 2 * k, False), ("2k+prefetch", 2 * k, True), ("k", k, False),
            ("k-1", k - 1, False), ("1", 1, False)]
    for name, slots, prefetch in runs:
        ids, logits, eff = _logits(path, N_UBATCH, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=info.budget_for(slots),
                                   longhaul_flags=LonghaulFlag.PREFETCH if prefetch else LonghaulFlag(0))
        assert eff == (1 if slots < k else info.effective_ubatch(info.budget_for(slots), N_UBATCH)), name
        if eff not in normal:
            normal[eff] = _logits(path, eff, load_mode=LoadMode.NONE)[:2]
        assert ids == normal[eff][0], f"{arch} at {name}"
        np.testing.assert_array_equal(logits, normal[eff][1], err_msg=f"{arch} ({shards} shards) at {name}")


@pytest.mark.parametrize("arch", list(SPECS))
def test_family_routing_record_replays_to_the_library_misses(family_model, arch) -> None:
    path = family_model(arch)
    info = inspect_model(path)
    k = info.n_expert_used
    prompt = np.random.default_rng(2).integers(3, 250, 24, dtype=np.int32)

    def run(slots: int):
        return record_run(path, prompt, 6, budget=info.budget_for(slots), n_threads=2, n_ubatch=8, timed=1)

    rec = run(k)
    assert sorted(rec.routing.layers) == sorted(info.expert_bytes)
    for slots in (1, k, 2 * k, info.n_expert):  # stages, one pass, waves (or a clamped ubatch), every expert
        got = run(slots)
        # the routing does not depend on the budget at the same ubatch (the same kernels); at another (one token at a
        # time, for stages) nearly tied experts may swap on some CPUs: that run's own recording is replayed
        same = got.n_ubatch_eff == rec.n_ubatch_eff
        for il, toks in rec.routing.layers.items():
            assert not same or np.array_equal(got.routing.layers[il], toks), (arch, slots, il)
        base = rec if same else got
        predicted = {il: int(m.sum()) for il, m in replay(base, info, info.budget_for(slots)).lru.items()}
        assert predicted == got.misses, (arch, slots)


@pytest.mark.parametrize("arch", list(SPECS))
def test_family_auto_budget_loads(family_model, arch) -> None:
    path = family_model(arch)
    info = inspect_model(path)
    fit = fit_longhaul_cache(path, context_params={"n_ctx": 256, "n_ubatch": N_UBATCH})
    assert fit.resident > 0 and fit.budget >= info.min_budget, fit
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache="auto") as m, \
            m.context(n_ctx=256, n_ubatch=N_UBATCH, n_threads=2) as ctx:
        ctx.decode(np.arange(3, 3 + N_PROMPT, dtype=np.int32))
        assert np.isfinite(ctx.logits()).all()


@pytest.mark.parametrize("arch", ["deepseek2", "glm4moe"])
def test_nextn_blocks_load_without_them_and_mtp_is_refused(family_model, arch) -> None:
    """A file with NextN (multi-token prediction) blocks, as published DeepSeek V3 and GLM-4.5 files carry them:
    longhaul loads the trunk without them, as upstream does by default (their experts are not streamed: the
    equality above runs on such files); asking for the MTP layers is refused, saying what to do."""
    from longhaul_cpp import LlamaError

    path = family_model(arch)
    info = inspect_model(path)
    assert info.n_layer == SPECS[arch].n_layer and max(info.expert_bytes) < info.n_layer
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=info.budget_for(1)) as m:
        assert len(m.longhaul_stats().layers) == len(SPECS[arch].moe_layers())
    with pytest.raises(LlamaError, match=r"MTP layers .* not supported in longhaul mode; drop it, or load the model "
                                         r"without longhaul"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache="1GiB", load_mtp=True)
