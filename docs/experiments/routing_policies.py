"""Issue 36's measurements (docs/routing-policies.md): how skew and a persistent token stream move per-layer
LRU hit rates, and how LFU / SLRU / ARC / Belady compare with LRU on the resulting traces. Deterministic (a fixed
trace is replayed), so the numbers do not depend on the machine.

    python docs/experiments/routing_policies.py grid      # hit rates at 16 and 32 of 128 slots, persistence
    python docs/experiments/routing_policies.py policies  # misses of each policy, and their ratio to Belady's
    python docs/experiments/routing_policies.py routers   # routers.ROUTERS: per-layer hits of each router
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from longhaul_cpp import SyntheticSpec, make_model
from longhaul_cpp.plan.policies import POLICIES
from longhaul_cpp.plan.record import record_routing
from longhaul_cpp.plan.replay import replay_lru, replay_optimal
from longhaul_cpp.models.routers import ROUTERS, previous_token_reuse, topic_stream

DIR = os.path.join(tempfile.gettempdir(), "longhaul-routing-policies")
N_EXPERT, K, N_PROMPT, N_GEN = 128, 8, 64, 384


def trace(skew: float, topic: int, stay: float, spread: float = 0.0):
    spec = SyntheticSpec(arch="qwen3moe", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, n_expert=N_EXPERT,
                         n_expert_used=K, n_ff_exp=32, expert_type="q8_0", router_skew=skew, router_skew_spread=spread)
    os.makedirs(DIR, exist_ok=True)
    path = os.path.join(DIR, f"m-{skew}-{spread}.gguf")
    if not os.path.exists(path):
        make_model(spec, path)
    toks = topic_stream(N_PROMPT + N_GEN, topic, stay)
    r = record_routing(path, toks[:N_PROMPT], toks[N_PROMPT:], n_ubatch=64, n_ctx=512, n_batch=64)
    calls = [N_PROMPT] + [1] * N_GEN
    return [(a, calls if len(a) == sum(calls) else [1] * len(a)) for a in r.layers.values()]


def grid() -> None:
    for skew in (0.0, 0.2, 0.4, 0.6, 1.2):
        for topic, stay in ((0, 0.0), (3, 0.85), (2, 0.7), (4, 0.85)):
            layers = trace(skew, topic, stay)
            hits = {}
            for s in (16, 32):
                m = sum(int(replay_lru(a, c, s, N_EXPERT, 64)[0][1:].sum()) for a, c in layers)
                hits[s] = 1 - m / (len(layers) * (len(layers[0][1]) - 1) * K)
            pers = np.mean([previous_token_reuse(a[-N_GEN:]) for a, _ in layers])
            print(f"skew {skew:3} topic {topic} stay {stay:4}: LRU hits {hits[16]:.0%} at 1/8, {hits[32]:.0%} at 1/4; "
                  f"previous token's experts {pers:.0%}")


def lru_hits(a: np.ndarray, c: list[int], s: int) -> float:
    return 1 - int(replay_lru(a, c, s, N_EXPERT, 64)[0][1:].sum()) / ((len(c) - 1) * K)


def routers() -> None:
    for name, r in ROUTERS.items():
        layers = trace(r.skew, r.topic, r.stay, r.spread)
        for s in (16, 32):
            per = [lru_hits(a, c, s) for a, c in layers]
            print(f"{name:10} {s} slots: LRU hits {np.mean(per):.0%} (layers {', '.join(f'{h:.0%}' for h in per)})")
        print(f"{name:10} previous token's experts {np.mean([previous_token_reuse(a[-N_GEN:]) for a, _ in layers]):.0%}")


def policies() -> None:
    for name in ("calibrated", "zipf"):
        r = ROUTERS[name]
        layers = trace(r.skew, r.topic, r.stay, r.spread)
        for s in (8, 16, 32):
            row = {p: sum(int(replay_lru(a, c, s, N_EXPERT, 64, cache=f)[0][1:].sum()) for a, c in layers)
                   for p, f in POLICIES.items()}
            best = sum(int(replay_optimal(a, c, s, N_EXPERT, 64)[1:].sum()) for a, c in layers)
            print(f"{name:10} {s:2} slots: " + ", ".join(f"{p} {v} ({v / best:.2f}x)" for p, v in row.items())
                  + f", belady {best}")


if __name__ == "__main__":
    {"grid": grid, "policies": policies, "routers": routers}[sys.argv[1]]()
