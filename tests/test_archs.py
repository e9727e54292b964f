"""Every MoE architecture upstream implements, in longhaul mode.

Upstream's `test-llama-archs -o DIR` writes a random model of each architecture it lists with experts
(`*-moe.gguf`: 2 experts, top-2, F32, a 128-token test vocabulary). A longhaul load must give the normal load's
token ids and logits bit for bit at the same ubatch, with every expert cached and with one slot per layer, or be
refused with the library's reason. The list is upstream's, read from what the binary writes and logs: a MoE
architecture upstream adds is tested here without a change, and one it lists but cannot write fails this test
until it is named below with the reason.
"""
from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import run, upstream_bin_dir
from longhaul_cpp import LlamaError, LoadMode, Model
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


@functools.lru_cache(maxsize=None)
def written() -> tuple[dict[str, Path], list[str]]:
    """arch -> the MoE model test-llama-archs wrote (once per session), and the MoE archs it skipped."""
    out = Path(tempfile.mkdtemp(prefix="archs-"))
    r = run([str(BIN / "test-llama-archs"), "-o", str(out)], timeout=600, text=True)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    skipped = re.findall(r"save_models: (\S+) model \(MoE\) is unsupported, skipping", log)
    return {p.name[: -len("-moe.gguf")]: p for p in sorted(out.glob("*-moe.gguf"))}, skipped


def greedy(path: Path, n_ubatch: int, **kw) -> tuple[list[int], np.ndarray, int, object]:
    with Model(path, **kw) as m, m.context(n_ctx=128, n_batch=64, n_ubatch=n_ubatch, n_threads=2) as ctx:
        eff = ctx.n_ubatch
        prompt = np.random.default_rng(0).integers(0, m.n_vocab, N_PROMPT)
        ids = list(ctx.greedy(prompt, N_GEN, stop_at_eog=False))
        logits = ctx.logits().copy()
        stats = m.longhaul_stats() if m.is_longhaul else None
    return ids, logits, eff, stats


@functools.lru_cache(maxsize=None)
def normal(arch: str, n_ubatch: int) -> tuple[list[int], np.ndarray]:
    ids, logits, _, _ = greedy(written()[0][arch], n_ubatch, load_mode=LoadMode.NONE)
    return ids, logits


def test_every_listed_moe_arch_is_written_or_named() -> None:
    models, skipped = written()
    assert len(models) >= 50, sorted(models)  # 55 at the pin
    assert sorted(skipped) == sorted(NOT_WRITTEN), "a MoE architecture upstream lists is neither tested nor named"


@pytest.mark.parametrize("slots", ["all", "1"])
def test_every_moe_arch(slots: str) -> None:
    """One test over every architecture (a parametrization by name would hide a new one behind collection)."""
    failures: list[str] = []
    ran, refused = [], []
    for arch, path in written()[0].items():
        info = inspect_model(path)
        expected = None
        if not info.expert_bytes:
            expected = NO_BANKS
        n_slots = info.n_expert if slots == "all" else 1
        budget = info.budget_for(n_slots) or 2**20
        try:
            ids, logits, eff, st = greedy(path, 64, load_mode=LoadMode.LONGHAUL, longhaul_cache=f"{budget}B")
        except LlamaError as e:
            ok = re.search(expected, str(e)) if expected else (n_slots < info.n_expert_used and re.search(NON_CAUSAL, str(e)))
            (refused if ok else failures).append(f"{arch}: {e}")
            continue
        if expected:
            failures.append(f"{arch}: loaded, but the library should refuse it ({expected})")
            continue
        assert all(layer.n_slots == n_slots for layer in st.layers), arch
        assert (st.total.n_misses > 0) != (arch in UNUSED_BANKS), arch
        ref_ids, ref_logits = normal(arch, eff)
        if ids != ref_ids or not np.array_equal(logits, ref_logits):
            diff = float(np.max(np.abs(logits - ref_logits)))
            failures.append(f"{arch}: differs from the normal load (ids equal: {ids == ref_ids}, max |dlogit| {diff})")
        ran.append(arch)
    assert not failures, "\n".join(failures)
    # at the pin: 2 fixtures without a MoE layer (ernie4_5, paddleocr) refused; at one slot also the 2 diffusion models
    assert len(refused) <= (2 if slots == "all" else 4), refused
    assert len(ran) + len(refused) == len(written()[0])


def test_dense_model_is_refused() -> None:
    """A model without routed experts: refused, saying to load it without longhaul."""
    path = next(iter(written()[0].values())).parent / "llama-dense.gguf"
    with pytest.raises(LlamaError, match=f"{NO_BANKS}; load it without --longhaul"):
        Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache="1MiB")
