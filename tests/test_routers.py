"""The synthetic routers (longhaul_cpp.models.routers): the calibrated router hits per-layer LRU caches as published models
do, its layers differ, and the uniform and zipf routers stay what they were (their hit rates are far from it)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from longhaul_cpp import SyntheticSpec
from longhaul_cpp.plan import replay_lru
from longhaul_cpp.plan.record import record_routing
from longhaul_cpp.models.routers import CALIBRATED_BAND, ROUTERS, previous_token_reuse, router_of, topic_stream
from longhaul_cpp.models.tensors import layer_skew

N_EXPERT, K, N_PROMPT, N_FED = 128, 8, 64, 384
REFERENCE = SyntheticSpec(arch="qwen3moe", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, n_expert=N_EXPERT,
                          n_expert_used=K, n_ff_exp=32, expert_type="q8_0")


def _hits(make_model, name: str) -> tuple[dict[int, float], dict[int, float], float]:
    """Per-layer LRU hit rates of the fed tokens at 1/8 and 1/4 of the experts, and the previous token's reuse."""
    r = router_of(name)
    path = make_model(**dataclasses.asdict(r.spec(REFERENCE)))[0]
    toks = r.stream(N_PROMPT + N_FED)
    routing = record_routing(path, toks[:N_PROMPT], toks[N_PROMPT:], n_ubatch=64, n_ctx=512, n_batch=64)
    out = []
    for slots in (N_EXPERT // 8, N_EXPERT // 4):
        per = {}
        for il, ids in routing.layers.items():
            # the last layer may run only the tokens whose logits are wanted (the prompt's last, then each one)
            calls = [N_PROMPT] + [1] * N_FED if len(ids) == N_PROMPT + N_FED else [1] * len(ids)
            m = replay_lru(ids, calls, slots, N_EXPERT, 64)[0]
            per[il] = 1 - int(m[-N_FED:].sum()) / (N_FED * K)
        out.append(per)
    reuse = float(np.mean([previous_token_reuse(ids[-N_FED:]) for ids in routing.layers.values()]))
    return out[0], out[1], reuse


def test_calibrated_router_hits_like_published_models(make_model) -> None:
    """Mean per-layer LRU hits within CALIBRATED_BAND (published: about 67 % at 1/8, 81 % at 1/4), the previous
    token's experts about 40 % of a selection, and the layers' hit rates differ (per-layer skew)."""
    h8, h4, reuse = _hits(make_model, "calibrated")
    lo, hi = CALIBRATED_BAND["1/8"]
    assert lo <= np.mean(list(h8.values())) <= hi, h8
    lo, hi = CALIBRATED_BAND["1/4"]
    assert lo <= np.mean(list(h4.values())) <= hi, h4
    assert 0.30 <= reuse <= 0.55
    assert max(h8.values()) - min(h8.values()) > 0.03, h8
    skews = [layer_skew(ROUTERS["calibrated"].spec(REFERENCE), il) for il in range(REFERENCE.n_layer)]
    assert len(set(skews)) == REFERENCE.n_layer and 0.2 <= min(skews) and max(skews) <= 0.6


@pytest.mark.parametrize("name", ["uniform", "zipf"])
def test_the_other_routers_are_outside_the_band(make_model, name) -> None:
    """The band separates: random tokens on a uniform router hit about capacity / experts, and zipf's static
    popularity with random tokens hits far more at 1/4 than published models do."""
    h8, h4, reuse = _hits(make_model, name)
    m8, m4 = np.mean(list(h8.values())), np.mean(list(h4.values()))
    if name == "uniform":
        assert m8 < CALIBRATED_BAND["1/8"][0] and m4 < CALIBRATED_BAND["1/4"][0] and reuse < 0.2
    else:
        assert m4 > CALIBRATED_BAND["1/4"][1]


def test_topic_stream() -> None:
    a = topic_stream(500, 3, 0.85, seed=4)
    assert np.array_equal(a, topic_stream(500, 3, 0.85, seed=4)) and a.dtype == np.int32
    assert a.min() >= 3 and a.max() <= 255
    # tokens stay within a topic: far fewer distinct tokens in a window than random tokens have
    win = lambda s: np.mean([len(set(s[i:i + 8])) for i in range(0, 480, 8)])  # noqa: E731
    assert win(a) < 5 < 7 < win(topic_stream(500, 0, 0.0, seed=4))
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        router_of("nope")
    with pytest.raises(ValueError, match="router_skew_spread"):
        dataclasses.replace(REFERENCE, router_skew_spread=2.0).validate()
