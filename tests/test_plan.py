"""The routing record and `longhaul-cpp plan`: the record is whole and bounded, routing does not depend on the
budget, replaying a run recorded at one budget gives the library's own misses at every other budget (k-stages,
expert waves, compact and pipelined waves, a split model), the optimal policy is a lower bound and optimal on a
known case, the time model reproduces its own run, and the command's table, JSON and errors."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp import LlamaError, LoadMode, LonghaulFlag, Model, Routing, RoutingRecorder, SyntheticSpec
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.plan import record as plan_record
from longhaul_cpp.plan import (Lru, PhaseModel, PhaseRun, knee, predict, record_run, replay, replay_lru,
                               replay_optimal)
from longhaul_cpp.routing import RoutingError

# 32 experts, top-4: a 16-token ubatch selects up to 32 (waves below every expert), one token 4 (stages below 4)
SPEC = SyntheticSpec(arch="qwen3moe", n_expert=32, n_expert_used=4, expert_type="q8_0")


def _model(make_model, spec: SyntheticSpec = SPEC, shards: int = 1) -> Path:
    return make_model(n_shards=shards, **dataclasses.asdict(spec))[0]


def _prompt(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 250, n, dtype=np.int32)


def _run(path: Path, slots: int, n_prompt: int = 48, n_gen: int = 12, n_ubatch: int = 16, timed: int = 1,
         flags: int = 0):
    # one timed repetition: its phases' counters are those of the recorded routing
    info = inspect_model(path)
    return info, record_run(path, _prompt(n_prompt), n_gen, budget=info.budget_for(slots), n_threads=2,
                            n_ubatch=n_ubatch, timed=timed, flags=flags)


def test_phases_keep_the_faster_repetition(make_model, monkeypatch) -> None:
    # each phase keeps the fastest of its timed repetitions; the routing and the misses to check the replay
    # against stay those of the first timed repetition
    seen: list[PhaseRun] = []
    real = plan_record.faster

    def spy(a: PhaseRun | None, b: PhaseRun) -> PhaseRun:
        seen.append(b)
        return real(a, b)

    monkeypatch.setattr(plan_record, "faster", spy)
    path = _model(make_model)
    info = inspect_model(path)
    rec = record_run(path, _prompt(48), 6, budget=info.budget_for(4), n_threads=2, n_ubatch=16, timed=3)
    assert len(seen) == 6  # prompt and generation of each timed repetition
    prompts, gens = seen[0::2], seen[1::2]
    assert [r.n_tokens for r in prompts + gens] == [48] * 3 + [6] * 3
    assert rec.prompt is min(prompts, key=lambda r: r.seconds) and rec.gen is min(gens, key=lambda r: r.seconds)
    assert {il: int(m.sum()) for il, m in replay(rec, info, rec.budget).lru.items()} == rec.misses
    assert plan_record.faster(None, gens[0]) is gens[0]
    fast = dataclasses.replace(gens[0], seconds=gens[0].seconds / 2)
    assert real(gens[0], fast) is fast and real(fast, gens[0]) is fast


@pytest.mark.parametrize("flags", [LonghaulFlag(0), LonghaulFlag.PIPELINE, LonghaulFlag.NO_COMPACT],
                         ids=["default", "pipelined", "full-waves"])
def test_replay_gives_the_library_misses_at_every_budget(make_model, flags) -> None:
    path = _model(make_model)
    info, rec = _run(path, 4, flags=flags)
    # the run records the switches in effect, the library's choices filled in: the replay follows them
    assert rec.flags & (LonghaulFlag.PIPELINE | LonghaulFlag.NO_PIPELINE) and rec.flags & flags == flags
    for slots in (1, 3, 4, 6, 8, 13, 32):  # stages of 1 and 2, k, waves (odd and even slots), every expert
        _, run = _run(path, slots, flags=flags)
        # the routing is the same at every budget of the same ubatch (the same kernels); a budget that runs one token
        # at a time (stages) replays its own recording: another kernel path may swap nearly tied experts
        same = run.n_ubatch_eff == rec.n_ubatch_eff
        for il, toks in rec.routing.layers.items():
            assert not same or np.array_equal(run.routing.layers[il], toks), (slots, il)
        got = replay(rec if same else run, info, info.budget_for(slots))
        assert {il: int(m.sum()) for il, m in got.lru.items()} == run.misses, slots
        assert sum(run.misses.values()) == run.prompt.n_misses + run.gen.n_misses
        for il in got.lru:  # the optimal policy never misses more
            assert (got.opt[il].sum() <= got.lru[il].sum()) and np.all(got.lru[il] <= got.selected[il])
    assert sum(replay(rec, info, info.budget_for(4)).lru[il].sum() for il in rec.routing.layers) > 0


def test_replay_of_a_split_model_and_another_arch(make_model) -> None:
    spec = SyntheticSpec(arch="qwen35moe", n_expert=16, n_expert_used=2, expert_type="q4_0")
    path = _model(make_model, spec, shards=3)
    info, rec = _run(path, 2, n_prompt=40, n_ubatch=8)
    for slots in (1, 5, 9):
        _, run = _run(path, slots, n_prompt=40, n_ubatch=8)
        base = rec if run.n_ubatch_eff == rec.n_ubatch_eff else run  # as above: the same kernels
        assert {il: int(m.sum()) for il, m in replay(base, info, info.budget_for(slots)).lru.items()} == run.misses


def test_record_shape_and_the_last_layer(make_model) -> None:
    path = _model(make_model)
    info, rec = _run(path, 4, n_prompt=48, n_gen=5)
    layers = sorted(rec.routing.layers)
    assert layers == sorted(info.expert_bytes)
    for il in layers[:-1]:
        assert rec.routing.layers[il].shape == (48 + 5, 4)
        assert rec.routing.ubatches[il] == [16, 16, 16] + [1] * 5
    # the last layer runs only the tokens whose logits are wanted
    assert rec.routing.layers[layers[-1]].shape == (1 + 5, 4)
    for a in rec.routing.layers.values():  # top-k: distinct ids per token, in range
        assert a.min() >= 0 and a.max() < 32 and all(len(set(row)) == 4 for row in a.tolist())


def test_record_is_bounded_and_works_in_any_load(make_model) -> None:
    """RoutingRecorder reads the ids through a normal load's eval callback: off until started, bounded (whole
    entries only), restartable. (That the routing equals a longhaul load's at every budget: the replay tests.)"""
    path = _model(make_model)
    info = inspect_model(path)
    rec = RoutingRecorder()
    with Model(path) as m, m.context(n_ctx=128, n_ubatch=16, routing=rec) as ctx:
        ctx.decode(_prompt(16))
        assert rec.routing().layers == {}  # off until started
        rec.start(3 + 16 * 4 + 3 + 16 * 4 + 5)  # two whole entries and a little
        ctx.reset()
        ctx.decode(_prompt(16))
        r = rec.routing()
        assert r.truncated and len(r.layers) == 2 and all(a.shape == (16, 4) for a in r.layers.values())
        with pytest.raises(RoutingError, match="truncated"):
            r.check_complete(16, 1)
        rec.start()
        rec.stop()  # stopped: nothing more is recorded
        ctx.reset()
        ctx.decode(_prompt(4, seed=1))
        assert rec.routing().layers == {} and not rec.routing().truncated
        with pytest.raises(ValueError):
            rec.start(0)
    # a longhaul context refuses an eval callback (it would see slot ids where imatrix reads expert ids)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=info.budget_for(4)) as m:
        with pytest.raises(LlamaError, match="eval callback"):
            m.context(n_ctx=128, routing=rec)


def test_routing_parse_rejects_malformed_records() -> None:
    ok = Routing.parse(np.array([2, 1, 2, 5, 6, 2, 2, 2, 7, 8, 9, 10], dtype=np.int32))
    assert ok.layers[2].tolist() == [[5, 6], [7, 8], [9, 10]] and ok.ubatches[2] == [1, 2]
    for bad in ([2, 1], [2, 3, 2, 1, 2], [1, 1, 2, 0, 1, 1, 1, 3, 4]):
        with pytest.raises(RoutingError):
            Routing.parse(np.array(bad, dtype=np.int32))


def test_lru_mirrors_the_library_planner() -> None:
    # the cases of tests/test-longhaul-policy.cpp (llama_longhaul_policy)
    lru = Lru(4, 16)
    assert lru.plan([3, 5, 3, 5, 7]) == 3 and lru.plan([5, 7, 3]) == 0
    lru = Lru(2, 8)
    lru.plan([0]), lru.plan([1]), lru.plan([0])  # 1 is now the least recently used
    assert lru.plan([2]) == 1 and not lru.cached(1) and lru.cached(0)
    # ties (one plan) go by slot index: 4 and 5 load into slots 0 and 1, 0 is evicted first
    lru = Lru(2, 8)
    lru.plan([4, 5])
    lru.plan([6])
    assert not lru.cached(4) and lru.cached(5)
    with pytest.raises(ValueError):
        Lru(2, 8).plan([1, 2, 3])


def test_optimal_policy_on_a_known_sequence() -> None:
    # a b c a b c with 2 slots: LRU misses all 6; Belady keeps a, evicts b, then a: 4 misses
    toks = np.array([[0], [1], [2], [0], [1], [2]], dtype=np.int32)
    calls = [1] * 6
    assert replay_optimal(toks, calls, 2, 3, 1).sum() == 4
    assert replay_lru(toks, calls, 2, 3, 1)[0].sum() == 6
    assert replay_optimal(toks, calls, 3, 3, 1).sum() == 3 == replay_lru(toks, calls, 3, 3, 1)[0].sum()
    with pytest.raises(ValueError, match="calls decode"):
        replay_lru(toks, [1] * 5, 2, 3, 1)


def test_random_generation_routes_alike_in_both_repetitions(make_model) -> None:
    """llama-bench's tg workload (random tokens): the replay still gives the run's misses."""
    path = _model(make_model)
    info = inspect_model(path)
    rec = record_run(path, _prompt(20), 10, budget=info.budget_for(6), n_threads=2, n_ubatch=16, random_gen=True)
    greedy = record_run(path, _prompt(20), 10, budget=info.budget_for(6), n_threads=2, n_ubatch=16)
    assert {il: int(m.sum()) for il, m in replay(rec, info, rec.budget).lru.items()} == rec.misses
    first = min(rec.routing.layers)
    assert not np.array_equal(rec.routing.layers[first][20:], greedy.routing.layers[first][20:])


def test_time_model_reproduces_its_own_run(make_model) -> None:
    path = _model(make_model)
    info, rec = _run(path, 4)
    rate = rec.gen.bytes_read / rec.gen.read_s  # the run's own read rate
    row = predict(rec, info, rate, [rec.budget])[0]
    assert row.gen_tps == pytest.approx(rec.gen.n_tokens / rec.gen.seconds, rel=1e-9)
    rate = rec.prompt.bytes_read / rec.prompt.read_s
    row = predict(rec, info, rate, [rec.budget])[0]
    assert row.prompt_tps == pytest.approx(rec.prompt.n_tokens / rec.prompt.seconds, rel=1e-9)
    all_row = predict(rec, info, rate, [info.budget_for(32)])[0]
    assert all_row.hit_lru_gen == 1.0 and all_row.mib_per_token_gen == 0 and all_row.gen_tps >= row.gen_tps
    gm = PhaseModel.of_generation(rec.gen, rec.hit_s)
    assert 0 <= gm.exposed <= 1 and gm.fixed_s <= rec.gen.seconds and gm.per_miss_s >= 0
    # every expert cached misses nothing: generation costs its tokens decoded again with their experts cached
    # (a prompt its time without any of its reads)
    assert rec.hit_s is not None and rec.hit_s > 0 and rec.gen.n_misses > 0
    rest = rec.gen.seconds - min(rec.gen.wait_s, rec.gen.read_s)
    assert gm.fixed_s == pytest.approx(min(rest, 12 * rec.hit_s), rel=1e-9)
    assert 12 / all_row.gen_tps == pytest.approx(gm.fixed_s, rel=1e-9)
    # each miss then costs the rest of the run's time, so the run's own budget still gives the run's time
    assert gm.fixed_s + gm.per_miss_s * rec.gen.n_misses == pytest.approx(rest, rel=1e-9)
    assert PhaseModel.of_generation(rec.gen).per_miss_s == 0  # no hit timing: the run's time at every budget
    assert 48 / all_row.prompt_tps == pytest.approx(rec.prompt.seconds - rec.prompt.read_s, rel=1e-9)
    assert rec.prompt.read_s > 0 and all_row.prompt_tps > row.prompt_tps


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])  # a KV cache; a recurrent state besides it
def test_hit_timing_reads_nothing_and_needs_every_expert_of_a_token(make_model, arch) -> None:
    """The hit timing decodes the last token again from the state before it: the same logits, nothing read, and
    the routing recorded is the run's (the replay check holds); below one slot per selected expert a token runs
    in stages and reads, so there is no hit timing and the planner keeps the run's time at every budget."""
    path = _model(make_model, dataclasses.replace(SPEC, arch=arch))
    info, rec = _run(path, 4)
    assert rec.hit_s is not None and rec.hit_s > 0
    assert {il: int(m.sum()) for il, m in replay(rec, info, rec.budget).lru.items()} == rec.misses
    toks = _prompt(8)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=info.budget_for(4)) as m, \
            m.context(n_ctx=64, n_threads=2) as ctx:
        ctx.decode(toks[:-1])
        state = ctx.state_get()
        ctx.decode(toks[-1:])  # one token: its experts fill the slots
        logits = ctx.logits().copy()
        before = m.longhaul_stats().total
        assert plan_record.time_hits(ctx, m, state, int(toks[-1]), 5) is not None
        after = m.longhaul_stats().total
        assert after.n_misses == before.n_misses and after.bytes_read == before.bytes_read
        assert after.n_hits > before.n_hits and ctx.n_past == 8
        np.testing.assert_array_equal(ctx.logits(), logits)
    _, staged = _run(path, 2)
    assert staged.hit_s is None
    assert PhaseModel.of_generation(staged.gen, staged.hit_s).per_miss_s == 0


def test_knee() -> None:
    from longhaul_cpp.plan import BudgetRow

    def rows(times: list[float]) -> list[BudgetRow]:
        return [BudgetRow(budget=i + 1, n_slots=i + 1, hit_lru_prompt=None, hit_lru_gen=None, hit_opt_gen=None,
                          mib_per_token_gen=None, mib_per_token_gen_opt=None, prompt_tps=None, gen_tps=1 / t,
                          gen_tps_opt=None) for i, t in enumerate(times)]

    assert knee(rows([10, 4, 2, 1.5, 1.2, 1.1, 1.0])).budget == 3  # diminishing returns
    assert knee(rows([7, 6, 5, 4, 3, 2, 1])) is None                # linear: no knee


def test_make_plan_measures_the_bandwidth(make_model) -> None:
    from longhaul_cpp.plan import make_plan

    path = _model(make_model)
    p = make_plan(path, _prompt(24), 4, n_threads=2, n_ubatch=16)
    assert p.bandwidth > 0 and p.bandwidth_source.startswith("measured: random")
    assert ("could not be dropped" in p.bandwidth_source) == (os.geteuid() != 0)
    assert p.check_exact
    assert len(p.rows) == 32 and p.rows[0].n_slots == 1 and p.rows[-1].hit_lru_gen == 1.0


def test_plan_takes_auto_as_its_budget(make_model) -> None:
    """budget="auto" (--longhaul-cache auto): the run's budget is the one fit_longhaul_cache picks for the run's
    own context, recorded in bytes; the replay at it matches the library."""
    from longhaul_cpp.fit import fit_longhaul_cache
    from longhaul_cpp.plan import make_plan

    path = _model(make_model)
    p = make_plan(path, _prompt(24), 4, n_threads=2, n_ubatch=16, budget="auto", bandwidth="run")
    cp = {"n_ctx": 24 + 4 + 8, "n_batch": 2048, "n_threads": 2, "n_threads_batch": 2, "n_ubatch": 16}
    assert p.run.budget == fit_longhaul_cache(path, context_params=cp).budget
    assert p.run.budget != inspect_model(path).budget_for(inspect_model(path).n_expert_used) and p.check_exact
    with pytest.raises(ValueError, match="size"):
        make_plan(path, _prompt(8), 1, n_threads=2, budget="lots")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longhaul_cpp", *args], capture_output=True, text=True, timeout=600)


def test_plan_command(make_model, tmp_path) -> None:
    path = _model(make_model)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    out = tmp_path / "plan.json"
    png = tmp_path / "plan.png"
    r = _cli("plan", str(path), "--prompt-file", str(prompt), "-n", "8", "--bandwidth", "100", "--json", str(out),
             "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib is a test dependency
    assert "replay check at the run's budget" in r.stdout and "(equal in every layer)" in r.stdout
    assert "hit LRU" in r.stdout and ("knee:" in r.stdout or "no knee" in r.stdout)
    doc = json.loads(out.read_text())
    assert [b["n_slots"] for b in doc["budgets"]] == list(range(1, 33))
    assert doc["bandwidth_bytes_per_s"] == 100 * 2**20
    assert doc["hit_s_per_token"] > 0 and "every expert it selects cached: " in r.stdout
    # the replacement and split recommendation: LRU, LFU and adaptive, even and planned, then Belady's bound
    rec = doc["recommendation"]
    assert [(c["policy"], c["split"]) for c in rec["configs"]] == [
        ("lru", "even"), ("lru", "planned"), ("lfu", "even"), ("lfu", "planned"), ("adaptive", "even"),
        ("adaptive", "planned"), ("belady", rec["configs"][6]["split"])]
    assert all(c["bytes_gen"] >= rec["configs"][6]["bytes_gen"] for c in rec["configs"])
    assert "recommended: " in r.stdout and "vs Belady" in r.stdout
    hits = [b["hit_lru_gen"] for b in doc["budgets"]]
    assert hits[-1] == 1.0 and all(b["hit_opt_gen"] >= b["hit_lru_gen"] for b in doc["budgets"])
    split = tmp_path / "split.json"
    r = _cli("plan", str(path), "-p", "16", "-n", "4", "--bandwidth", "run", "--all", "--write-split", str(split))
    assert r.returncode == 0 and "the recorded run's own reads" in r.stdout, r.stderr
    from longhaul_cpp.longhaul import load_split
    doc = json.loads(split.read_text())
    assert f"wrote {split}" in r.stdout and len(load_split(split)) == inspect_model(path).n_layer
    assert {il for il, n in enumerate(load_split(split)) if n} == {int(il) for il in doc["even_slots"]}
    assert len([ln for ln in r.stdout.splitlines() if re.search(r"[0-9.]+ (B|KiB|MiB|GiB) ", ln) and "%" in ln]) == 32
    for args, code, msg in ((["--bandwidth", "0"], 2, "bandwidth"), (["--bandwidth", "fast"], 2, "bandwidth"),
                            (["-n", "-1"], 2, "-n"),
                            (["--longhaul-cache", "1KiB"], 1, "minimum")):
        r = _cli("plan", str(path), "-p", "8", *args)
        assert r.returncode == code and msg in r.stderr, (args, r.stderr)
    r = _cli("plan", str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and "missing" in r.stderr


def test_plot_without_matplotlib_fails_after_the_table(make_model, tmp_path, monkeypatch, capsys) -> None:
    from longhaul_cpp.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    path = _model(make_model)
    assert main(["plan", str(path), "-p", "8", "-n", "2", "--bandwidth", "100", "--plot", str(tmp_path / "x.png")]) == 1
    out = capsys.readouterr()
    assert "hit LRU" in out.out and "--plot needs matplotlib" in out.err and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("flags", [LonghaulFlag(0), LonghaulFlag.NO_REPACK], ids=["repacked", "plain"])
def test_record_counts_the_conversion_and_plan_names_the_switch(make_model, flags) -> None:
    """The recorded phases carry the library's conversion time (the reading threads'); where the generated
    tokens spent a share of their time converting, `plan` names --no-longhaul-repack, and with the slots plain
    there is nothing to convert and no hint."""
    from longhaul_cpp.plan.recommend import repack_hint

    path = _model(make_model, dataclasses.replace(SPEC, expert_type="q4_0"))
    info = inspect_model(path)
    rec = record_run(path, _prompt(48), 12, budget=info.budget_for(4), n_threads=2, n_ubatch=16, flags=int(flags))
    assert rec.gen.n_misses > 0 and rec.gen.convert_s >= 0
    if flags & LonghaulFlag.NO_REPACK:
        assert rec.gen.convert_s == 0 and rec.prompt.convert_s == 0
        assert repack_hint(rec, min_share=0.0) is None
        return
    if rec.gen.convert_s == 0:
        pytest.skip("this CPU has no repacked kernels for Q4_0 banks: nothing is converted")
    hint = repack_hint(rec, min_share=0.0)
    assert hint is not None and "--no-longhaul-repack" in hint
    assert f"spent {1e3 * rec.gen.convert_s / rec.gen.n_tokens:.1f} ms per generated token" in hint
    # the threshold: a share of the token's time below it gives no hint
    assert repack_hint(rec, min_share=rec.gen.convert_s / rec.gen.seconds * 1.01) is None
