"""Issue 58: bytes read per token by LRU-even, LRU with the offline planned split (of the same trace), LRU with
the online split, LFU-even, LFU+online, adaptive (LRU or LFU per layer) even and online, ARC, SLRU and Belady, at 1/8 and 1/4 of the experts, on each trace."""
# usage: python traces.py DIR [N] (models and routing traces), then python evaluate.py DIR out.json (the table)
import sys, glob, json, numpy as np
from longhaul_cpp.plan.policies import Adaptive, LruCache, Lfu, Arc, Slru, split_budget, POLICIES
from longhaul_cpp.plan.replay import replay_lru, replay_optimal, CachePolicy
from longhaul_cpp.plan.online import replay_online, OnlineParams

def load(f):
    z = np.load(f)
    layers = {int(il): z[f"l{il}"] for il in z["layers"]}
    eb = {int(il): int(b) for il, b in zip(z["layers"], z["expert_bytes"])}
    return layers, [int(c) for c in z["calls"]], int(z["n_expert"]), eb

def steady(layers, calls):
    """the trace twice; the second repetition counted (as the planner's replay)"""
    return {il: np.concatenate([a, a]) for il, a in layers.items()}, calls + calls

def run(f, frac, params=OnlineParams(), rows=None):
    layers, calls, n_expert, eb = load(f)
    k = next(iter(layers.values())).shape[1]
    n = len(calls)
    s_even = max(k, round(n_expert * frac))
    even = {il: s_even for il in layers}
    budget = sum(even[il] * eb[il] for il in layers)
    L2, C2 = steady(layers, calls)
    def fixed(slots, cache=LruCache):
        return sum(int(replay_lru(L2[il], C2, slots[il], n_expert, 512, cache=cache)[0][n:].sum()) * eb[il] for il in layers)
    # offline planned split: curves from the steady replay at every slot count
    step = max(1, (n_expert - k) // 24)
    counts = sorted({*range(k, n_expert + 1, step), n_expert})
    def curves(cache):
        out = {}
        for il in layers:
            c = np.zeros(n_expert + 1, dtype=np.int64)
            got = [replay_lru(L2[il], C2, s, n_expert, 512, cache=cache)[0][n:].sum() for s in counts]
            c[:] = np.round(np.interp(np.arange(n_expert + 1), counts, got))
            c[:k] = c[k]
            out[il] = c
        return out
    res = {}
    res["lru-even"] = fixed(even)
    cl = curves(LruCache)
    planned = split_budget(cl, eb, budget, {il: k for il in layers})
    res["lru-planned"] = fixed(planned)
    ceil = {il: n_expert - 1 for il in layers}
    on = replay_online(L2, C2, n_expert, eb, even, 512, params=params, floor=k + 1, ceiling=ceil)
    res["lru-online"] = on.bytes_read(eb, slice(n, None))
    on1 = replay_online(layers, calls, n_expert, eb, even, 512, params=params, floor=k + 1, ceiling=ceil)
    ev1 = sum(int(replay_lru(layers[il], calls, s_even, n_expert, 512)[0].sum()) * eb[il] for il in layers)
    res["lru-online-cold/even-cold"] = on1.bytes_read(eb) / ev1 if ev1 else 1.0
    res["lfu-even"] = fixed(even, Lfu)
    on_lfu = replay_online(L2, C2, n_expert, eb, even, 512, params=params, floor=k + 1, ceiling=ceil, cache=Lfu)
    res["lfu-online"] = on_lfu.bytes_read(eb, slice(n, None))
    res["adaptive-even"] = fixed(even, Adaptive)
    on_ad = replay_online(L2, C2, n_expert, eb, even, 512, params=params, floor=k + 1, ceiling=ceil, cache=Adaptive)
    res["adaptive-online"] = on_ad.bytes_read(eb, slice(n, None))
    res["arc-even"] = fixed(even, Arc)
    res["slru-even"] = fixed(even, Slru)
    res["belady-even"] = sum(int(replay_optimal(L2[il], C2, s_even, n_expert, 512)[n:].sum()) * eb[il] for il in layers)
    res["moves"] = on.n_moves
    res["online_end"] = sorted(on.slots.values())
    res["planned"] = sorted(planned.values())
    return res

def _job(a):
    f, frac = a
    return f, frac, run(f, frac)


if __name__ == "__main__":
    from multiprocessing import Pool, cpu_count
    files = sorted(glob.glob(sys.argv[1] + "/*.npz"))
    out = {}
    with Pool(cpu_count()) as pool:  # each case on its own; printed in order
        for f, frac, r in pool.imap(_job, [(f, fr) for f in files for fr in (1/8, 1/4)]):
            name = f.split("/")[-1][:-4]
            base = r["lru-even"] or 1
            pl = r["lru-planned"] or 1
            print(f"{name:32} {frac:.3f} even {base/2**20:9.1f} MiB | planned {r['lru-planned']/base:.3f} "
                  f"online {r['lru-online']/base:.3f} (vs planned {r['lru-online']/pl:.3f}, cold {r['lru-online-cold/even-cold']:.3f}) "
                  f"| lfu {r['lfu-even']/base:.3f} lfu+on {r['lfu-online']/base:.3f} "
                  f"adaptive {r['adaptive-even']/base:.3f} ad+on {r['adaptive-online']/base:.3f} arc {r['arc-even']/base:.3f} "
                  f"slru {r['slru-even']/base:.3f} belady {r['belady-even']/base:.3f} moves {r['moves']}", flush=True)
            out[f"{name}@{frac}"] = r
    json.dump(out, open(sys.argv[2], "w"), indent=1, default=str)
