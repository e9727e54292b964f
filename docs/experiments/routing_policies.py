"""Issue 36's first measurements (docs/routing-policies.md): how skew and a persistent token stream move per-layer
LRU hit rates, and how LFU / SLRU / Belady compare with LRU on the resulting traces. Deterministic (a fixed trace
is replayed), so the numbers do not depend on the machine.

    python docs/experiments/routing_policies.py grid      # hit rates at 16 and 32 of 128 slots, persistence
    python docs/experiments/routing_policies.py policies  # misses of each policy, and their ratio to Belady's
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

DIR = os.path.join(tempfile.gettempdir(), "longhaul-routing-policies")
N_EXPERT, K, N_PROMPT, N_GEN = 128, 8, 64, 384


def stream(n: int, topic: int, stay: float, seed: int = 0) -> np.ndarray:
    """Byte tokens from a `topic` of a few tokens, kept with probability `stay` at each step (0: random tokens)."""
    rng = np.random.default_rng(seed)
    if topic == 0:
        return rng.integers(3, 256, n).astype(np.int32)
    out, cur = [], rng.choice(np.arange(3, 256), topic, replace=False)
    for _ in range(n):
        if rng.random() > stay:
            cur = rng.choice(np.arange(3, 256), topic, replace=False)
        out.append(int(rng.choice(cur)))
    return np.array(out, np.int32)


def trace(skew: float, topic: int, stay: float):
    spec = SyntheticSpec(arch="qwen3moe", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, n_expert=N_EXPERT,
                         n_expert_used=K, n_ff_exp=32, expert_type="q8_0", router_skew=skew)
    os.makedirs(DIR, exist_ok=True)
    path = os.path.join(DIR, f"m-{skew}.gguf")
    if not os.path.exists(path):
        make_model(spec, path)
    toks = stream(N_PROMPT + N_GEN, topic, stay)
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
            pers = np.mean([np.mean([len(set(x) & set(y)) / K for x, y in zip(a[-N_GEN:-1], a[-N_GEN + 1:])])
                            for a, _ in layers])
            print(f"skew {skew:3} topic {topic} stay {stay:4}: LRU hits {hits[16]:.0%} at 1/8, {hits[32]:.0%} at 1/4; "
                  f"previous token's experts {pers:.0%}")


def policies() -> None:
    for name, (skew, topic, stay) in {"persistent": (0.4, 3, 0.85), "zipf": (1.2, 0, 0.0)}.items():
        layers = trace(skew, topic, stay)
        for s in (8, 16, 32):
            row = {p: sum(int(replay_lru(a, c, s, N_EXPERT, 64, cache=f)[0][1:].sum()) for a, c in layers)
                   for p, f in POLICIES.items()}
            best = sum(int(replay_optimal(a, c, s, N_EXPERT, 64)[1:].sum()) for a, c in layers)
            print(f"{name:10} {s:2} slots: " + ", ".join(f"{p} {v} ({v / best:.2f}x)" for p, v in row.items())
                  + f", belady {best}")


if __name__ == "__main__":
    {"grid": grid, "policies": policies}[sys.argv[1]]()
