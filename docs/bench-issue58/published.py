"""Issue 58: the replacement policies on routing traces others published (JSON, one per file:
{"source", "model", "n_expert", "top_k", "n_prefill_tokens", "layers": {"<layer>": [[ids of token 0], ...]}}).
Replays LRU, LFU, adaptive and Belady at 1/16, 1/8 and 1/4 of the experts, each layer alike (the even split),
steady state (the trace twice, the second counted, as the planner's replay); prints misses per generated token."""
# usage: python published.py FILE.json [...]
import json
import sys

import numpy as np

from longhaul_cpp.plan.policies import Adaptive, Lfu, LruCache
from longhaul_cpp.plan.replay import replay_lru, replay_optimal


def replay(path: str) -> None:
    d = json.load(open(path))
    n_expert, n_pre = int(d["n_expert"]), int(d.get("n_prefill_tokens", 0))
    layers = {int(il): np.array(rows, dtype=np.int32) for il, rows in d["layers"].items()}
    n_tok = len(next(iter(layers.values())))
    calls = ([n_pre] if n_pre else []) + [1] * (n_tok - n_pre)
    n_gen = n_tok - n_pre
    print(f"{d['model']}: {len(layers)} layers, {n_expert} experts, top-{d['top_k']}, {n_pre} prompt + {n_gen} "
          f"generated tokens ({d['source']})")
    twice = {il: np.concatenate([a, a]) for il, a in layers.items()}
    for frac in (1 / 16, 1 / 8, 1 / 4):
        slots = max(int(d["top_k"]), round(frac * n_expert))
        cut = len(calls) + (1 if n_pre else 0)  # the second repetition's decode calls

        def misses(cache) -> int:
            return sum(int(replay_lru(t, calls + calls, slots, n_expert, 512, cache=cache)[0][cut:].sum())
                       for t in twice.values())
        got = {name: misses(c) for name, c in (("lru", LruCache), ("lfu", Lfu), ("adaptive", Adaptive))}
        got["belady"] = sum(int(replay_optimal(t, calls + calls, slots, n_expert, 512)[cut:].sum())
                            for t in twice.values())
        lru = got["lru"] or 1
        print(f"  {frac:.4g} ({slots} slots): misses per generated token " +
              ", ".join(f"{k} {v / n_gen:.2f} ({v / lru:.3f}x LRU)" for k, v in got.items()))


if __name__ == "__main__":
    for f in sys.argv[1:]:
        replay(f)
