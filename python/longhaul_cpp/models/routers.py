"""The routers of the synthetic models and the token streams that drive them (docs/routing-policies.md).

A synthetic model routes by the current token, so how a cache hits depends on two things: the router's skew
(Zipf-like expert popularity, `SyntheticSpec.router_skew`, different per layer with `router_skew_spread`) and
how persistent the token stream is. Real routing is flatter than a steep skew and persists from token to token;
the "calibrated" router reproduces the published figures (per-layer LRU at 1/8 and 1/4 of the experts hitting
about 67 % and 81 %, the previous token's experts about 40 % of a selection) with a mild per-layer skew and a
stream that stays on a "topic" of a few tokens.

- uniform: no skew, random tokens (every policy hits capacity / experts: the worst case for a cache);
- zipf: skew 1.2, random tokens (static popularity: frequency-aware policies win);
- calibrated: skew 0.4 spread over 0.2-0.6 by layer, topics of 3 tokens kept with probability 0.85.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .spec import SyntheticSpec

FIRST_TOKEN = 3      # the byte vocabulary's first byte token (0-2: unk, bos, eos)
N_BYTE_TOKENS = 256  # byte tokens FIRST_TOKEN .. FIRST_TOKEN + 255 (the streams draw from the first 253)


@dataclasses.dataclass(frozen=True)
class Router:
    skew: float           # SyntheticSpec.router_skew
    spread: float         # SyntheticSpec.router_skew_spread
    topic: int            # tokens per topic of the stream (0: random tokens)
    stay: float           # probability of keeping the topic at each token

    def spec(self, spec: SyntheticSpec) -> SyntheticSpec:
        """`spec` with this router."""
        return dataclasses.replace(spec, router_skew=self.skew, router_skew_spread=self.spread)

    def stream(self, n: int, seed: int = 0) -> np.ndarray:
        """n byte tokens for this router (topic_stream)."""
        return topic_stream(n, self.topic, self.stay, seed)


ROUTERS: dict[str, Router] = {
    "uniform": Router(skew=0.0, spread=0.0, topic=0, stay=0.0),
    "zipf": Router(skew=1.2, spread=0.0, topic=0, stay=0.0),
    "calibrated": Router(skew=0.4, spread=0.5, topic=3, stay=0.85),
}

# the calibrated router's per-layer LRU hit rates on the reference model (tests/test_routers.py: 128 experts, top-8,
# 64 prompt tokens then 384 fed one at a time), and the published figures they stand for
CALIBRATED_BAND = {"1/8": (0.60, 0.74), "1/4": (0.76, 0.90)}
PUBLISHED_HITS = {"1/8": 0.67, "1/4": 0.81}


def topic_stream(n: int, topic: int, stay: float, seed: int = 0) -> np.ndarray:
    """n byte tokens: a topic of `topic` distinct tokens, each token drawn from it, and the topic redrawn with
    probability 1 - stay before each token; topic 0: independent random tokens."""
    rng = np.random.default_rng(seed)
    pool = np.arange(FIRST_TOKEN, N_BYTE_TOKENS)
    if topic <= 0:
        return rng.choice(pool, n).astype(np.int32)
    out = np.empty(n, dtype=np.int32)
    cur = rng.choice(pool, topic, replace=False)
    for i in range(n):
        if rng.random() > stay:
            cur = rng.choice(pool, topic, replace=False)
        out[i] = rng.choice(cur)
    return out


def router_of(name: str) -> Router:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router '{name}': use one of {', '.join(ROUTERS)}") from None


def previous_token_reuse(ids: np.ndarray) -> float:
    """The share of a token's selected experts the token before selected too ([n_tokens, k] ids of one layer)."""
    if len(ids) < 2:
        return 0.0
    k = ids.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids[:-1], ids[1:])]))
