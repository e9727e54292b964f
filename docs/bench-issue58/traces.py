"""Routing traces for issue 58's comparisons: generated models of several families, token streams of several
shapes, routing recorded on a normal load (record_routing). Writes DIR/NAME.npz (layers, calls, expert_bytes)."""
import sys, subprocess, numpy as np
from pathlib import Path
from longhaul_cpp.plan.record import record_routing
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.models.routers import topic_stream, ROUTERS

out = Path(sys.argv[1]); out.mkdir(exist_ok=True)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
FAM = {  # arch: make-model args
    "qwen3moe": ["--n-expert", "128", "--n-expert-used", "8"],
    "gpt-oss": ["--n-expert", "32", "--n-expert-used", "4"],
    "deepseek2": ["--n-expert", "64", "--n-expert-used", "6"],
    "glm4moe": ["--n-expert", "128", "--n-expert-used", "8"],
    "llama4": ["--n-expert", "16", "--n-expert-used", "1"],
    "qwen35moe": ["--n-expert", "256", "--n-expert-used", "8"],
}
def streams(n):
    r = ROUTERS["calibrated"]
    yield "topic", [], [int(t) for t in r.stream(n, seed=1)]
    a = topic_stream(n // 2, r.topic, r.stay, seed=2)
    b = topic_stream(n - n // 2, r.topic, r.stay, seed=3)
    # an unrelated second topic: the tokens of the other half of the byte range
    a = 3 + (a - 3) % 126
    b = 129 + (b - 3) % 126
    yield "phase", [], [int(t) for t in np.concatenate([a, b])]
    # a chat of several turns: each user turn a prompt call, each answer tokens one at a time, topics alternating
    rng = np.random.default_rng(4)
    prompt, toks = [], []
    turns = []
    for t in range(6):
        u = topic_stream(120, r.topic, r.stay, seed=10 + t)
        g = topic_stream(n // 6 - 120, r.topic, r.stay, seed=20 + t)
        turns.append((u, g))
    yield "chat", turns, None
    yield "random", [], [int(t) for t in topic_stream(n, 0, 0, seed=5)]

for arch, args in FAM.items():
    for router in ("calibrated", "zipf"):
        m = out / f"{arch}-{router}.gguf"
        if not m.exists():
            subprocess.run([sys.executable, "-m", "longhaul_cpp", "make-model", "--arch", arch, "--n-layer", "8",
                            "--router", router, *args, str(m)], check=True, capture_output=True)
        info = inspect_model(m)
        for name, turns, toks in streams(N):
            f = out / f"{arch}-{router}-{name}.npz"
            if f.exists():
                continue
            if turns:
                # one record per turn: the user's prompt as one call, then the answer token by token
                layers, calls = {}, []
                from longhaul_cpp.model import Model
                from longhaul_cpp.routing import RoutingRecorder
                with Model(m) as model:
                    rec = RoutingRecorder(info.arch)
                    with model.context(n_ctx=N + 256, n_batch=512, n_ubatch=512, n_threads=1, routing=rec) as ctx:
                        rec.start(1 << 26)
                        for u, g in turns:
                            # every token an output so that the last layer covers them all
                            ctx.decode(np.asarray(u, dtype=np.int32), all_logits=True)
                            calls.append(len(u))
                            for t in g:
                                ctx.decode([int(t)])
                                calls.append(1)
                        rec.stop()
                    routing = rec.routing()
            else:
                routing = record_routing(m, np.zeros(0, dtype=np.int32), toks, n_ubatch=512, n_ctx=N + 8, n_threads=1)
                calls = [1] * len(toks)
            n_tok = sum(calls)
            full = {il: a for il, a in routing.layers.items() if len(a) == n_tok}
            np.savez(f, calls=np.array(calls), n_expert=info.n_expert,
                     layers=np.array(sorted(full)), **{f"l{il}": a for il, a in full.items()},
                     expert_bytes=np.array([info.expert_bytes[il] for il in sorted(full)]))
            print(f.name, len(full), "layers", n_tok, "tokens", flush=True)
