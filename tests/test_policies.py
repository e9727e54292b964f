"""The planner's other replacement policies (plan.policies) and the per-layer split of a budget: the policies'
shared base is the library's LRU (tests/test_plan.py checks it against the library), every policy keeps a plan's experts within its slots and reads no
fewer experts than Belady's optimum, and the split honours its budget and reads no more than the even split."""
from __future__ import annotations

import json

import numpy as np
import pytest

from longhaul_cpp.plan import replay_lru
from longhaul_cpp.plan.policies import POLICIES, Lfu, LruCache, Slru, split_budget
from longhaul_cpp.plan.replay import replay_optimal

N_EXPERT, K = 32, 4


def _trace(seed: int, n: int = 300, hot: int = 0) -> tuple[np.ndarray, list[int]]:
    """A prompt of 40 tokens then n decode tokens; hot > 0: a few experts much more popular (a skewed layer)."""
    rng = np.random.default_rng(seed)
    p = np.ones(N_EXPERT)
    p[:hot] = 12.0
    p /= p.sum()
    toks = np.array([rng.choice(N_EXPERT, K, replace=False, p=p) for _ in range(40 + n)], dtype=np.int32)
    return toks, [40] + [1] * n


def _ubatch(slots: int) -> int:
    return 1 if slots < K else 16  # fewer slots than a token's experts: the library runs one token at a time


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("slots", [4, 9, 20])
def test_policies_stay_within_their_slots_and_above_the_optimum(name, slots) -> None:
    toks, calls = _trace(7, hot=4)
    caches = []

    def make(n_slots: int, n_expert: int):
        caches.append(POLICIES[name](n_slots, n_expert))
        return caches[-1]

    misses, _ = replay_lru(toks, calls, slots, N_EXPERT, 16, cache=make)
    cache = caches[0]
    held = [e for e in cache.slot_expert if e >= 0]
    assert len(held) == len(set(held)) <= slots
    assert all(cache.expert_slot[e] == s for s, e in enumerate(cache.slot_expert) if e >= 0)
    assert misses.sum() >= replay_optimal(toks, calls, slots, N_EXPERT, 16).sum()


def test_frequency_and_segments_change_the_choice() -> None:
    """On a skewed trace LFU keeps the popular experts that LRU lets go; the policies are not LRU renamed."""
    toks, calls = _trace(3, n=600, hot=4)
    got = {name: int(replay_lru(toks, calls, 8, N_EXPERT, 16, cache=c)[0].sum())
           for name, c in [("lru", LruCache), ("lfu", Lfu), ("slru", Slru)]}
    assert got["lfu"] < got["lru"] and got["slru"] != got["lru"]


def test_split_budget_honours_the_budget_and_beats_the_even_split() -> None:
    layers = {0: _trace(1, hot=6), 1: _trace(2), 2: _trace(4, hot=2)}
    eb = {0: 100, 1: 100, 2: 150}
    curves = {il: [0] + [int(replay_lru(t, c, s, N_EXPERT, _ubatch(s))[0].sum()) for s in range(1, N_EXPERT + 1)]
              for il, (t, c) in layers.items()}
    budget = 12 * 100 + 12 * 100 + 12 * 150
    split = split_budget(curves, eb, budget)
    assert all(s >= 1 for s in split.values()) and sum(split[il] * eb[il] for il in split) <= budget
    even = {il: 12 for il in layers}
    read = lambda alloc: sum(curves[il][alloc[il]] * eb[il] for il in alloc)  # noqa: E731
    assert read(split) <= read(even)
    assert split != even  # the layers differ: so does their share
    with pytest.raises(ValueError, match="below one slot per layer"):
        split_budget(curves, eb, 300)


@pytest.mark.parametrize("policy", ["lru", "lfu", "adaptive"])
def test_the_planned_split_is_what_the_library_reads(make_model, tmp_path, policy) -> None:
    """plan_split on a recorded run, for the library's LRU and its opt-in LFU: loaded as longhaul_layer_slots
    (from the file, as --longhaul-split reads it) with that replacement, the library misses in each layer what
    the replay said (the second repetition, as the planner counts), and the split reads no more than the even
    one."""
    from longhaul_cpp import LonghaulFlag, SyntheticSpec
    from longhaul_cpp.modelinfo import inspect_model
    from longhaul_cpp.plan import random_prompt, record_run
    from longhaul_cpp.plan.policies import POLICIES, policy_flags
    from longhaul_cpp.longhaul import load_split
    from longhaul_cpp.plan.split import layer_curves, plan_split

    spec = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0", router_skew=0.8)
    path = make_model(**{f: getattr(spec, f) for f in ("arch", "n_expert", "n_expert_used", "expert_type",
                                                        "router_skew")})[0]
    info = inspect_model(path)
    budget = info.budget_for(8)
    prompt = random_prompt(path, 48)
    run = record_run(path, prompt, 24, budget=budget, n_threads=2, n_ubatch=64, random_gen=True, timed=1)
    cache = POLICIES[policy]
    sp = plan_split(run, info, budget, step=1, replacement=policy)
    assert sum(sp.slots[il] * info.expert_bytes[il] for il in sp.slots) <= budget
    assert all(info.n_expert_used <= s <= info.n_expert for s in sp.slots.values())
    assert sp.bytes_split <= sp.bytes_even
    sp.to_json(tmp_path / "split.json")
    slots = load_split(tmp_path / "split.json")
    assert len(slots) == info.n_layer and {il: slots[il] for il in sp.slots} == sp.slots
    assert json.loads((tmp_path / "split.json").read_text())["policy"] == policy
    flags = policy_flags(policy)
    again = record_run(path, prompt, 24, budget=budget, n_threads=2, n_ubatch=64, random_gen=True, timed=1,
                       layer_slots=tmp_path / "split.json", flags=flags)
    assert again.flags & (LonghaulFlag.LFU | LonghaulFlag.ADAPTIVE) == flags
    curves = layer_curves(run, info, list(range(info.n_expert_used, info.n_expert + 1)), 64, cache=cache)
    assert again.misses == {il: int(curves[il][slots[il]]) for il in sp.slots}


@pytest.mark.parametrize("policy", ["LFU", "ADAPTIVE"])
@pytest.mark.parametrize("slots,pipelined", [(5, False), (6, True)])
def test_lfu_replay_is_the_library_in_compact_and_pipelined_waves(make_model, slots, pipelined, policy) -> None:
    """LFU's counts and aging (and, under ADAPTIVE, its two shadows and their scores) follow the library's plans
    exactly where a prompt runs in compact expert waves (whose graph has spare syncs that plan nothing) and in
    pipelined ones (each sync plans two waves): the planner's replay of the run gives the library's misses in every
    layer."""
    from longhaul_cpp import LonghaulFlag, SyntheticSpec
    from longhaul_cpp.modelinfo import inspect_model
    from longhaul_cpp.plan import random_prompt, record_run, replay_check
    from longhaul_cpp.plan.replay import compact_waves_for

    spec = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0", router_skew=0.8)
    path = make_model(**{f: getattr(spec, f) for f in ("arch", "n_expert", "n_expert_used", "expert_type",
                                                        "router_skew")})[0]
    info = inspect_model(path)
    wave_slots = slots // 2 if pipelined else slots
    assert compact_waves_for(4, 48, wave_slots, 16) > -(-16 // wave_slots)  # spare syncs in the graph
    flags = LonghaulFlag[policy] | (LonghaulFlag.PIPELINE if pipelined else LonghaulFlag.NO_PIPELINE)
    run = record_run(path, random_prompt(path, 48), 24, budget=info.budget_for(slots), n_threads=2, n_ubatch=64,
                     random_gen=True, timed=1, flags=flags)
    assert {il: got for il, (got, _) in replay_check(run, info).items()} == run.misses


def test_a_split_file_is_a_list_of_whole_numbers(tmp_path) -> None:
    """The planner's split file as Model(longhaul_layer_slots=path) reads it: "layer_slots" is a list of whole slot
    counts; an object (which would be read in its keys' order), 3.7, "3" or true is refused, naming the entry."""
    from longhaul_cpp.longhaul import load_split

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"layer_slots": [0, 3, 5]}))
    assert load_split(good) == [0, 3, 5]
    for bad, named in (({"0": 1, "10": 2, "2": 3}, "dict"), ([1, 3.7], "3.7"), ([1, "3"], "'3'"), ([True, 2], "True"),
                       ([1, -2], "-2")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"layer_slots": bad}))
        with pytest.raises(ValueError, match=f"not a split .*{named}"):
            load_split(path)


def test_lfu_second_repetition_is_the_replay_of_three(make_model, monkeypatch) -> None:
    """record_run under LFU with two timed repetitions: the second reads what a replay of the warm-up and both
    repetitions gives for it (the decodes that time a cached token run after the last repetition: before, they ran
    between the two and added uses the replay does not know)."""
    from longhaul_cpp import LonghaulFlag, SyntheticSpec
    from longhaul_cpp.modelinfo import inspect_model
    from longhaul_cpp.plan import random_prompt, record_run
    from longhaul_cpp.plan import record as plan_record
    from longhaul_cpp.plan.policies import cache_for_flags
    from longhaul_cpp.plan.replay import policy_from_flags

    spec = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0", router_skew=0.8)
    path = make_model(**{f: getattr(spec, f) for f in ("arch", "n_expert", "n_expert_used", "expert_type",
                                                        "router_skew")})[0]
    info = inspect_model(path)
    seen = []
    real = plan_record.faster
    monkeypatch.setattr(plan_record, "faster", lambda a, b: (seen.append(b), real(a, b))[1])
    run = record_run(path, random_prompt(path, 32), 16, budget=info.budget_for(6), n_threads=2, n_ubatch=64,
                     timed=2, flags=LonghaulFlag.LFU)
    assert run.hit_s is not None and len(seen) == 4  # prompt and generation of each repetition
    policy, cache = policy_from_flags(info.expert_bias, run.flags), cache_for_flags(run.flags)
    slots, ubatch, n = info.slots(run.budget), info.effective_ubatch(run.budget, run.n_ubatch), len(run.calls)
    third = 0
    for il, toks in run.routing.layers.items():
        m, _ = replay_lru(np.concatenate([toks] * 3), run.layer_calls(il) * 3, slots[il], info.n_expert, ubatch,
                          policy, cache)
        third += int(m[2 * n:].sum())
    assert seen[2].n_misses + seen[3].n_misses == third
