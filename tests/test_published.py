"""Published MoE files at their real scale, without their weights (`longhaul_cpp.models.published`: the published tensor
inventory, every tensor's type chosen by the shipped llama-quantize, the shard count; the data a sparse hole but
for the norms, the routers' first columns and the first embedding rows): gpt-oss-20b and gpt-oss-120b (MXFP4, the
latter in three shards), Qwen3-30B-A3B Q4_K_M and an Inkling-Small UD-IQ1_S mix in three shards.

For each, at the spec's 2 GiB and at `auto`: the load reads no expert before the first decode; every routed layer
has the slots the header arithmetic gives (`longhaul-cpp info` prints them); a prompt and a few generated tokens
read experts from every shard and from offsets past 4 GiB; the peak RSS stays within the resident weights, the
slots, the KV cache, the compute and read buffers (the library's own dry-run figures) plus 5 %.
The files take a few tens of MiB on disk; the tests skip, saying why, where the filesystem has no sparse files.
The writer of every byte (`--data random`, for speed at real scale) is tested on small inventories of the same
recipes: bytes in each tensor's type, a routing that varies, longhaul equal to a normal load.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp import LoadMode, Model, RoutingRecorder, SyntheticSpec
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.models.published import PUBLISHED, Published, sparse_files_supported, write_published

from conftest import run

GIB = 2**30
PROMPT = [1, 72, 105, 33, 10]  # ids below 259: their embedding rows are the random ones
N_GEN = 3

PROBE = r"""
import json, re, sys
import numpy as np
from longhaul_cpp import LoadMode, Model
from longhaul_cpp._lib import lib
from longhaul_cpp.fit import fit_longhaul_cache

def status():
    s = open("/proc/self/status").read()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", s, re.M).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}

path, budget, prompt, n_gen = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
lib()
base = status()["VmRSS"]
fit = fit_longhaul_cache(path, context_params={"n_ctx": 256, "n_ubatch": 64})
with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m, \
        m.context(n_ctx=256, n_ubatch=64, n_threads=2) as ctx:
    read_at_load = m.longhaul_stats().total.bytes_read
    chosen = m.longhaul_fit.budget if m.longhaul_fit else None  # auto: the load's own choice
    ctx.decode(np.array(prompt, dtype=np.int32))
    ids = []
    for _ in range(n_gen):
        ids.append(int(np.argmax(ctx.logits())))
        ctx.decode(ids[-1:])
    st = m.longhaul_stats()
    hwm = status()["VmHWM"]
print(json.dumps(dict(base=base, hwm=hwm, read_at_load=read_at_load, resident=fit.resident, kv=fit.context,
                      compute=fit.compute, io=fit.io, auto=chosen, slots=[l.n_slots for l in st.layers],
                      misses=[l.n_misses for l in st.layers])))
"""


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("published")
    if not sparse_files_supported(d):
        pytest.skip(f"the filesystem of {d} keeps no sparse files: the real-scale files would take their full size")
    return d


def bank_layout(paths: list[Path], n_layer: int) -> dict[int, tuple[int, int]]:
    """routed layer -> (shard holding its banks, largest data offset of its banks in that shard)."""
    import gguf

    out: dict[int, tuple[int, int]] = {}
    for i, p in enumerate(paths):
        r = gguf.GGUFReader(p)
        for t in r.tensors:
            if "_exps.weight" in t.name and int(t.name.split(".")[1]) < n_layer:
                il = int(t.name.split(".")[1])
                out[il] = (i, max(out.get(il, (i, 0))[1], int(t.data_offset)))
    return out


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_file_at_real_scale(name, out_dir) -> None:
    paths = write_published(name, out_dir)
    try:
        check_file(name, paths)
    finally:
        for p in paths:
            p.unlink()


def check_file(name: str, paths: list[Path]) -> None:
    pub = PUBLISHED[name]
    spec = pub.spec
    info = inspect_model(paths[0])
    assert len(paths) == pub.n_shards and info.shards == paths
    assert sum(p.stat().st_blocks * 512 for p in paths) < 128 * 2**20, "not sparse"
    assert info.file_bytes > 10 * GIB and info.n_expert == spec.n_expert and info.n_layer == spec.n_layer
    assert sorted(info.expert_bytes) == spec.moe_layers()
    layout = bank_layout(paths, info.n_layer)
    assert {s for s, _ in layout.values()} == set(range(len(paths))), "every shard holds routed banks"
    for i in range(len(paths)):
        assert max(off for s, off in layout.values() if s == i) > 4 * GIB, f"shard {i}: no bank past 4 GiB"

    # what is published about the real file (Published.facts, with their sources in the module)
    facts = dict(pub.facts)
    assert facts, f"{name}: no published fact to check the inventory against"
    if "file_gb" in facts:
        assert abs(info.file_bytes / 1e9 / facts["file_gb"] - 1) < 0.01, (info.file_bytes / 1e9, facts["file_gb"])
    if "shards" in facts:
        assert len(paths) == facts["shards"]
    if "slots_at_2gib" in facts:  # every layer, so each MoE layer runs a token in one stage when k fits
        assert set(info.slots(2 * GIB).values()) == {facts["slots_at_2gib"]}, info.slots(2 * GIB)

    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(paths[0]), "--longhaul-cache", "2GiB"], text=True)
    assert r.returncode == 0, r.stderr
    per = sorted(set(info.slots(2 * GIB).values()))
    if "slots_at_2gib" in facts and spec.n_expert_used <= facts["slots_at_2gib"]:
        assert "1 stage(s) per MoE layer" in r.stdout, r.stdout
    assert f"{', '.join(map(str, per))} slots per layer" in r.stdout and "prompts:" in r.stdout, r.stdout
    assert "resident:" in r.stdout
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(paths[0]), "--longhaul-cache", "auto", "-c", "256",
             "-ub", "64"], text=True)
    assert r.returncode == 0 and "auto budget:" in r.stdout and "slots per layer" in r.stdout, r.stdout + r.stderr

    for budget in ("2GiB", "auto"):
        r = run([sys.executable, "-c", PROBE, str(paths[0]), budget, json.dumps(PROMPT), str(N_GEN)], timeout=1200,
                text=True)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        chosen = 2 * GIB if budget == "2GiB" else got["auto"]
        slots = info.slots(chosen)
        assert got["slots"] == [slots[il] for il in sorted(slots)], (budget, got["slots"])
        assert got["read_at_load"] == 0, "experts were read before the first decode"
        missed = {il for il, n in zip(sorted(slots), got["misses"]) if n > 0}
        assert missed == set(slots), f"{budget}: layers that read nothing: {sorted(set(slots) - missed)}"
        for i in range(len(paths)):  # every shard read, at offsets past 4 GiB
            assert any(layout[il][0] == i and layout[il][1] > 4 * GIB for il in missed), (budget, i)
        # the peak (at auto too: the slots are the chosen budget's)
        cache = sum(slots[il] * info.expert_bytes[il] for il in slots)
        bound = 1.05 * (got["resident"] + cache + got["kv"] + got["compute"] + got["io"])
        peak = got["hwm"] - got["base"]
        assert peak <= bound, (f"{budget}: peak RSS {peak / GIB:.3f} GiB above {bound / GIB:.3f} GiB (resident "
                               f"{got['resident'] / GIB:.3f}, slots {cache / GIB:.3f}, KV {got['kv']}, "
                               f"compute {got['compute']}, read buffers {got['io']})")


@pytest.mark.parametrize("ftype, overrides", [("Q4_K_M", ()), ("MXFP4_MOE", ()), ("IQ1_S", ("ffn_down_exps=iq2_xxs",))])
def test_random_data_is_every_byte_in_its_type(tmp_path, ftype: str, overrides: tuple[str, ...]) -> None:
    """`published NAME DIR --data random` at a small scale: the writer behind it gives every tensor its bytes in the
    type the quantizer chose (the file occupies its size on disk), with the calibrated router; the model loads and
    decodes, its routing varies from token to token, and longhaul gives a normal load's tokens and logits."""
    arch = "gpt-oss" if ftype == "MXFP4_MOE" else "qwen3moe"
    spec = SyntheticSpec(arch=arch, n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_expert=16, n_expert_used=4,
                         n_ff_exp=256, n_ff=256, n_swa=64 if arch == "gpt-oss" else 0)
    pub = Published(spec, ftype, n_shards=2, overrides=overrides)
    paths = write_published(pub, tmp_path, data="random")
    size = sum(p.stat().st_size for p in paths)
    assert sum(p.stat().st_blocks * 512 for p in paths) >= 0.95 * size  # written, not holes
    info = inspect_model(paths[0])
    assert len(info.expert_bytes) == 3 and info.file_bytes == size
    prompt = np.array(PROMPT * 4, dtype=np.int32)

    def greedy(**kw):
        with Model(paths[0], **kw) as m:
            rec = RoutingRecorder(arch)  # a normal load's (longhaul refuses an eval callback)
            with m.context(n_ctx=128, n_threads=2, **({} if kw else {"routing": rec})) as ctx:
                rec.start()
                ctx.decode(prompt)
                ids, logits = [], []
                for _ in range(6):
                    logits.append(ctx.logits().copy())
                    ids.append(int(np.argmax(logits[-1])))
                    ctx.decode(ids[-1:])
                rec.stop()
            return ids, np.array(logits), rec.routing()

    ids, logits, routing = greedy()
    assert np.isfinite(logits).all() and logits.std() > 0
    for il, sel in routing.layers.items():  # the router is not degenerate: tokens pick different experts
        assert len(np.unique(sel)) > spec.n_expert_used, (il, sel)
    lh_ids, lh_logits, _ = greedy(load_mode=LoadMode.LONGHAUL, longhaul_cache=info.budget_for(spec.n_expert_used))
    assert lh_ids == ids
    np.testing.assert_array_equal(lh_logits, logits)
