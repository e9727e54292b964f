"""Every MoE architecture upstream implements, in longhaul mode.

Upstream's `test-llama-archs -o DIR` writes a random model of each architecture it lists with experts
(`*-moe.gguf`: F32, a 128-token test vocabulary, the architecture's own tensors from its loader: shared experts,
biases, selection biases, leading dense layers, interleaved MoE, MLA, ...); `-e 32,4` (series patch 0007) gives
them 32 experts and top-4. A longhaul load must give the normal load's token ids and logits (every prompt position,
then the decoded ones) bit for bit at the same ubatch, at every expert cached, 2k (also with the cross-layer
prefetch on), k, k-1 and one slot per layer (one pass, expert waves, stages), or be refused with the library's
reason. The list is upstream's, read from what the binary writes and logs: a MoE
architecture upstream adds is tested here without a change, and one it lists but cannot write fails this test
until it is named below with the reason.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import logits_and_greedy, run, upstream_bin_dir
from longhaul_cpp import LlamaError, LoadMode, LonghaulFlag, Model
from longhaul_cpp.modelinfo import inspect_model

BIN = upstream_bin_dir()
pytestmark = pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")

# MoE architectures upstream lists that its test cannot write (so not run here), and why
NOT_WRITTEN = {
    "step35": "upstream's model saver does not support it (test-llama-archs skips it)",
    "llama-embed": "an embedding model: longhaul refuses embeddings (test-llama-archs skips it)",
}
# the library's refusals: (architecture, slots) -> the message it must give
NO_BANKS = "has no routed expert tensors to stream"  # the fixture gives these archs no MoE layer
# archs whose graph never reads the routed banks it loads (so longhaul reads nothing either)
UNUSED_BANKS = {"refact": "upstream's refact graph loads expert banks but runs a dense FFN"}
NON_CAUSAL = r"runs a batch as one ubatch \(non-causal attention\)"  # diffusion: one slot would cut the batch

N_PROMPT, N_GEN = 24, 8
N_EXPERT, N_USED = 32, 4


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[dict[str, Path], list[str]]:
    """arch -> the MoE model test-llama-archs wrote (once per module, in pytest's temporary folder), and the MoE
    archs it skipped. Of the dense models it writes, only llama's is kept (test_dense_model_is_refused)."""
    out = tmp_path_factory.mktemp("archs")
    r = run([str(BIN / "test-llama-archs"), "-o", str(out)], timeout=600, text=True)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    for p in out.glob("*-dense.gguf"):
        if p.name != "llama-dense.gguf":
            p.unlink()
    skipped = re.findall(r"save_models: (\S+) model \(MoE\) is unsupported, skipping", log)
    return {p.name[: -len("-moe.gguf")]: p for p in sorted(out.glob("*-moe.gguf"))}, skipped


def wide_model(arch: str, out: Path) -> Path:
    """The architecture's MoE model with N_EXPERT experts, top-N_USED."""
    r = run([str(BIN / "test-llama-archs"), "-a", arch, "-e", f"{N_EXPERT},{N_USED}", "-o", str(out)], timeout=600,
            text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return out / f"{arch}-moe.gguf"


def greedy(path: Path, n_ubatch: int, **kw) -> tuple[list[int], np.ndarray, int, object]:
    """Every prompt position's logits, then N_GEN greedy tokens and their logits."""
    with Model(path, **kw) as m, m.context(n_ctx=128, n_batch=64, n_ubatch=n_ubatch, n_threads=2) as ctx:
        eff = ctx.n_ubatch
        ids, rows = logits_and_greedy(ctx, np.random.default_rng(0).integers(0, m.n_vocab, N_PROMPT), N_GEN)
        stats = m.longhaul_stats() if m.is_longhaul else None
    return ids, rows, eff, stats


def test_every_listed_moe_arch_is_written_or_named(written) -> None:
    models, skipped = written
    assert len(models) >= 50, sorted(models)  # 55 at the pin
    assert sorted(skipped) == sorted(NOT_WRITTEN), "a MoE architecture upstream lists is neither tested nor named"


def test_every_moe_arch(written, tmp_path) -> None:
    """One test over every architecture (a parametrization by name would hide a new one behind collection)."""
    failures: list[str] = []
    ran, refused = [], []
    prefetched: dict[str, int] = {}  # the cross-layer prefetch (PREFETCH): bytes it read ahead, per arch
    for arch in written[0]:
        path = wide_model(arch, tmp_path)
        try:
            failures += check_arch(arch, path, ran, refused, prefetched)
        finally:
            path.unlink()
    assert not failures, "\n".join(failures)
    # at the pin: 2 fixtures without a MoE layer (ernie4_5, paddleocr) refused at every budget, the 2 diffusion models
    # below k slots
    assert len(refused) <= 2 * 6 + 2 * 2, refused
    assert len(ran) + len(refused) == 6 * len(written[0])
    # the prefetch ran wherever a decode has a next routed layer to guess for (2 or more routed layers)
    assert sum(1 for b in prefetched.values() if b > 0) >= 20, prefetched
    check_readme(supported_block(ran, refused))


README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- archs:begin (tests/test_archs.py writes this" , "<!-- archs:end -->"


def supported_block(ran: list[str], refused: list[str]) -> str:
    """README's architecture list, from the library's answers in this run: which ran at every budget, which only
    at some (and the library's reason for the others), which it refused at every budget, which were not written."""
    budgets = 6
    ok: dict[str, int] = {}
    for what in ran:
        arch = what.split(" at ", 1)[0]
        ok[arch] = ok.get(arch, 0) + 1
    why: dict[str, str] = {}
    for what in refused:
        arch, rest = what.split(" at ", 1)
        msg = rest.split(": ", 1)[1]
        why[arch] = NO_BANKS if NO_BANKS in msg else "non-causal (diffusion): k slots or more" \
            if re.search(NON_CAUSAL, msg) else msg.splitlines()[0][:120]
    every = sorted(a for a, n in ok.items() if n == budgets)
    some = sorted(a for a, n in ok.items() if n < budgets)
    none = sorted(set(why) - set(ok))
    lines = [f"  - Run bit-exact at every budget ({len(every)}): " + ", ".join(every) + "."]
    if some:
        lines.append(f"  - Run at some budgets, refused at the others ({len(some)}): "
                     + ", ".join(f"{a} ({why[a]})" for a in some) + ".")
    if none:
        lines.append(f"  - Refused ({len(none)}): " + ", ".join(f"{a} ({why[a]})" for a in none)
                     + ": upstream's fixture gives them no MoE layer.")
    lines.append("  - Not run (upstream's test cannot write them): "
                 + "; ".join(f"{a} ({r})" for a, r in sorted(NOT_WRITTEN.items())) + ".")
    import textwrap

    return "\n".join(textwrap.fill(line, 92, subsequent_indent="    ", break_on_hyphens=False) for line in lines)


def check_readme(block: str) -> None:
    """README's list is this run's (LONGHAUL_UPDATE_README=1 writes it)."""
    import os

    text = README.read_text()
    i, j = text.index(BEGIN), text.index(END)
    head = text[:i] + text[i:].split("\n", 1)[0] + "\n"
    new = head + block + "\n" + text[j:]
    if os.environ.get("LONGHAUL_UPDATE_README") == "1":
        README.write_text(new)
    assert new == text, f"README's architecture list is stale; LONGHAUL_UPDATE_README=1 rewrites it:\n{block}"


def budget_cases(n_expert: int, k: int) -> list[tuple[str, int]]:
    """The budgets check_arch runs, as (name, slots per layer): every expert, 2k (also with the prefetch), k, k-1 and
    1; k-1 only where k > 1 (with one expert per token there is no budget below k)."""
    cases = [("all", n_expert), ("2k", 2 * k), ("2k prefetch", 2 * k), ("k", k), ("k-1", k - 1), ("1", 1)]
    return [c for c in cases if c[0] != "k-1" or k > 1]


def check_arch(arch: str, path: Path, ran: list[str], refused: list[str], prefetched: dict[str, int]) -> list[str]:
    info = inspect_model(path)
    failures: list[str] = []
    normal: dict[int, tuple[list[int], np.ndarray]] = {}
    k = info.n_expert_used
    for name, n_slots in budget_cases(info.n_expert, k):
        what = f"{arch} at {name} ({n_slots} slots)"
        expected = NO_BANKS if not info.expert_bytes else NON_CAUSAL if n_slots < k else None
        budget = info.budget_for(n_slots) or 2**20
        flags = LonghaulFlag.PREFETCH if name.endswith("prefetch") else LonghaulFlag(0)
        try:
            ids, logits, eff, st = greedy(path, 64, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget,
                                          longhaul_flags=flags)
        except LlamaError as e:
            ok = expected and re.search(expected, str(e)) and "--longhaul-cache" not in str(e)  # Python's words
            (refused if ok else failures).append(f"{what}: {e}")
            continue
        if expected == NO_BANKS:
            failures.append(f"{what}: loaded, but the library should refuse it ({expected})")
            continue
        # the budget buys n_slots in the layers of the largest experts, as many as `info` predicts in the others
        # (a quantization mix types some layers' banks smaller)
        slots = [layer.n_slots for layer in st.layers]
        if min(slots) != n_slots or slots != list(info.slots(budget).values()) or \
                (st.total.n_misses > 0) == (arch in UNUSED_BANKS):
            failures.append(f"{what}: slots {slots}, misses {st.total.n_misses}")
            continue
        if eff not in normal:
            normal[eff] = greedy(path, eff, load_mode=LoadMode.NONE)[:2]
        ref_ids, ref_logits = normal[eff]
        if ids != ref_ids or not np.array_equal(logits, ref_logits):
            diff = float(np.max(np.abs(logits - ref_logits)))
            failures.append(f"{what}: differs from the normal load (ids equal: {ids == ref_ids}, max |dlogit| {diff})")
        ran.append(what)
        if name.endswith("prefetch"):
            prefetched[arch] = st.total.bytes_prefetched
    return failures


# the families users run most (gpt-oss, DeepSeek V3 / Kimi K2, GLM-4.5, Llama 4, Mixtral-style llama), also split in
# three shards by the shipped llama-gguf-split: experts are read from the shard that holds each bank
SPLIT_FAMILIES = ["gpt-oss", "deepseek2", "glm4moe", "llama4", "llama"]


@pytest.mark.parametrize("arch", SPLIT_FAMILIES)
def test_family_split_in_three_shards(arch, tmp_path) -> None:
    from longhaul_cpp import tool_path

    whole = wide_model(arch, tmp_path)
    import gguf

    n_tensors = len(gguf.GGUFReader(str(whole)).tensors)
    stem = tmp_path / f"{arch}-split"
    r = run([str(tool_path("llama-gguf-split")), "--split-max-tensors", str(-(-n_tensors // 3)), str(whole), str(stem)],
            timeout=300, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    shards = sorted(tmp_path.glob(f"{arch}-split-0000*-of-00003.gguf"))
    assert len(shards) == 3, shards
    holding = [p for p in shards if any("_exps.weight" in t.name for t in gguf.GGUFReader(str(p)).tensors)]
    assert holding and holding != shards[:1], holding  # banks in a later shard (and in more than one where the
    # model has several MoE layers: gpt-oss, llama4, llama)
    whole.unlink()
    ran: list[str] = []
    failures = check_arch(arch, shards[0], ran, [], {})
    assert not failures, "\n".join(failures)
    assert len(ran) == 6


def test_dense_model_is_refused(written) -> None:
    """A model without routed experts: refused, saying to load it without longhaul."""
    path = next(iter(written[0].values())).parent / "llama-dense.gguf"
    with pytest.raises(LlamaError, match=f"{NO_BANKS}; load it without --longhaul"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache="1MiB")


def test_every_moe_arch_plans_and_fits(written, tmp_path) -> None:
    """The routing record, its replay (the planner's input) and `auto` on every architecture: the record at k slots
    replays to the library's own misses at one slot and at 2k (stages, waves), and `auto` sizes the model from the
    library's dry runs. Nothing in them may assume one family's tensors."""
    from longhaul_cpp.fit import fit_longhaul_cache
    from longhaul_cpp.plan import record_run, replay

    failures: list[str] = []
    checked = 0
    for arch in written[0]:
        path = wide_model(arch, tmp_path)
        try:
            info = inspect_model(path)
            k = info.n_expert_used
            if not info.expert_bytes or arch in UNUSED_BANKS:
                continue
            prompt = np.random.default_rng(3).integers(0, 128, 16, dtype=np.int32)
            ubatch = 16 if arch in ("llada-moe", "rnd1") else 8  # diffusion: the batch is one ubatch

            def rec(slots: int):
                return record_run(path, prompt, 0 if ubatch == 16 else 4, budget=info.budget_for(slots),
                                  n_threads=2, n_ubatch=ubatch, timed=1)

            base = rec(k)
            for slots in ([k, 2 * k] if ubatch == 16 else [1, 2 * k]):
                got = rec(slots)
                # a run at another ubatch (stages: one token at a time) replays its own recording: other kernels
                same = got.n_ubatch_eff == base.n_ubatch_eff
                predicted = {il: int(m.sum()) for il, m in
                             replay(base if same else got, info, info.budget_for(slots)).lru.items()}
                if predicted != got.misses:
                    failures.append(f"{arch} at {slots} slots: replay {predicted} != library {got.misses}")
                if sorted(got.routing.layers) != sorted(info.expert_bytes) or (slots < k and not sum(got.misses.values())):
                    failures.append(f"{arch} at {slots} slots: nothing recorded or read ({got.misses})")
            fit = fit_longhaul_cache(path, context_params={"n_ctx": 128, "n_ubatch": ubatch})
            if fit.budget < info.min_budget:
                failures.append(f"{arch}: auto chose {fit.budget} B, below one slot per layer ({info.min_budget} B)")
            checked += 1
        except Exception as e:  # noqa: BLE001 (collect every architecture's failure)
            failures.append(f"{arch}: {type(e).__name__}: {e}")
        finally:
            path.unlink()
    assert not failures, "\n".join(failures)
    assert checked >= 50, checked
