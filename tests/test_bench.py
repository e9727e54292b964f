"""Smoke test of the benchmark harness (`longhaul-cpp bench`) on a tiny model: it runs the tools,
reads their counters and writes its reports. No speed is asserted (these machines are noisy)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pytest

from conftest import needs_cap, run
from longhaul_cpp import SyntheticSpec
from longhaul_cpp.bench import MemoryCap, Run, parse_fractions, run_process
from longhaul_cpp.longhaul import gib_arg

BENCH = [sys.executable, "-m", "longhaul_cpp", "bench"]


TINY = SyntheticSpec(arch="qwen35moe", n_expert=16, n_expert_used=4, expert_type="q8_0")


def _tiny(make_model) -> Path:
    return make_model(**dataclasses.asdict(TINY))[0]


def _direct_ok(path: Path) -> bool:
    """Whether the file's filesystem takes O_DIRECT (tmpfs does not: the library reads buffered there)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


def test_bench_smoke(make_model, tmp_path) -> None:
    model = _tiny(make_model)
    out = tmp_path / "out"
    r = run(BENCH + ["--model", str(model), "--scenarios", "resident,allcached,sweep", "--budgets", "1/4,1",
                     "-p", "32", "-n", "8", "-r", "1", "--no-cold", "-o", str(out)], text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    runs = res["runs"]
    assert [(x["scenario"], x["test"]) for x in runs] == [
        ("resident", "pp32"), ("resident", "tg8"), ("resident", "pp32"), ("resident", "tg8"),
        ("allcached", "pp32"), ("allcached", "tg8"),
        ("sweep", "pp32"), ("sweep", "tg8"), ("sweep", "pp32"), ("sweep", "tg8")]
    assert all(x["status"] == "ok" and x["tokens_per_s"] > 0 and x["peak_rss_gib"] > 0 for x in runs)
    lh = [x for x in runs if x["budget_bytes"] is not None]
    assert all(x["load"] == "longhaul" for x in lh) and {x["load"] for x in runs} == {"normal", "longhaul"}
    assert all(x["hit_rate"] is not None and x["expert_gib_read"] is not None for x in lh)
    quarter = [x for x in lh if x["fraction"] == 0.25]
    # budgets are whole slots per layer, in bytes, passed to the library exactly
    assert {x["budget_bytes"] for x in quarter} == {TINY.budget_for(4)}
    assert {x["budget_bytes"] for x in lh if x["scenario"] == "allcached"} == {TINY.budget_for(16)}
    assert quarter[0]["expert_gib_read"] > 0  # a quarter of the experts cannot hold a prompt's working set
    full_tg = [x for x in lh if x["scenario"] == "allcached" and x["test"] == "tg8"][0]
    assert full_tg["hit_rate"] == 1.0 and full_tg["expert_gib_read"] == 0  # warm: the prompt filled the cache
    targets = {t["target"]: t for t in res["analysis"]["targets"]}
    ratio = targets["every expert cached: generation / resident (default load, same layout)"]
    # the target is the ratio of the two runs it names, judged against its goal (no speed is asserted)
    default_tg = [x for x in runs if x["scenario"] == "resident" and x["test"] == "tg8" and x["layout"] == "repacked"][0]
    assert ratio["measured"] == pytest.approx(full_tg["tokens_per_s"] / default_tg["tokens_per_s"], rel=1e-6)
    assert all(x["convert_s"] is not None for x in lh)  # the conversion's share of the reads is recorded
    # the prefetch's recall and wasted bytes are recorded for every longhaul run (0 where it read nothing)
    assert all(x["prefetch_recall"] is not None and 0 <= x["prefetch_recall"] <= 1 for x in lh)
    assert all(0 <= x["prefetch_wasted_gib"] <= x["expert_gib_read"] for x in lh)
    assert ratio["met"] == (ratio["measured"] >= ratio["goal"])
    # the sweep reads its experts from the storage even with the page cache warm (--no-cold warms the model
    # file before each run), as for a model that does not fit in memory: the process read at least the timed
    # runs' expert bytes from the disk (buffered reads would find them in the page cache: checked by hand with
    # --sweep-direct-io off; not asserted on the normal runs, whose page cache another root process on the
    # machine may drop)
    sweep = [x for x in runs if x["scenario"] == "sweep"]
    assert res["sweep_direct_io"] == "on"
    if _direct_ok(model):
        reads = [x for x in sweep if x["fraction"] == 0.25]
        assert all(x["disk_gib_read"] >= x["expert_gib_read"] > 0 for x in reads), reads
    # the planner's prediction for each sweep run, and its error as a target
    assert all(x["predicted_tokens_per_s"] > 0 for x in sweep)
    assert set(res["plan"]["uniform"]) == {str(TINY.budget_for(4)), str(TINY.budget_for(16))}
    planner = [t for t in res["analysis"]["targets"] if t["target"].startswith("sweep: the planner")][0]
    assert planner["measured"] == pytest.approx(max(abs(x["predicted_tokens_per_s"] / x["tokens_per_s"] - 1)
                                                    for x in sweep), rel=1e-6)
    # peak RSS is judged against resident weights, budget, the normal load's KV and buffers, and for longhaul the
    # library's read and staging buffers (outside the budget): the limit of a longhaul run exceeds a normal one's
    # by exactly those
    assert res["model"]["io_bytes"] >= 4 * 2**20
    rss = res["analysis"]["peak_rss"]
    resident = res["model"]["file_gib"] - res["model"]["routed_gib"]
    plain = [x for x in runs if x["layout"] == "plain" and x["scenario"] == "resident"]
    extra = max(x["peak_rss_gib"] - res["model"]["file_gib"] for x in plain)
    for row, x in zip(rss, lh):
        want = (resident + x["budget_bytes"] / 2**30 + max(extra, 0) + res["model"]["io_bytes"] / 2**30) * 1.05
        assert row["limit_gib"] == pytest.approx(want, rel=1e-9)
    md = (out / "results.md").read_text()
    assert "| sweep | longhaul 0.25 of experts |" in md and "| target |" in md
    assert "The planner (`longhaul-cpp plan`" in md
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"  # matplotlib is a test dependency
    assert "Where prompt time goes" in md and "Where generation time goes" in md
    # with --no-cold the probe runs all the same (--no-cold skips the cold runs): every longhaul run of prompt and
    # generation gets its bound, max(reads, compute), and the sum, reads + compute, from its own bytes and the probe
    bw = res["read_bandwidth"]["bytes_per_s"]
    assert bw > 0 and res["read_bandwidth"]["threads"] >= 5  # the library's 4 to 8 reading threads and the caller
    for key in ("prompt_time", "generation_time"):
        rows = [b for b in res["analysis"][key] if b["scenario"] == "sweep"]
        assert len(rows) == 2, key
        for b in rows:
            read_s = b["expert_mib_read_per_token"] * 2**20 / bw
            assert b["read_s_per_token"] == pytest.approx(read_s, rel=1e-9)
            assert b["bound_tokens_per_s"] == pytest.approx(1 / max(read_s, b["compute_s_per_token"]), rel=1e-9)
            assert b["sum_tokens_per_s"] == pytest.approx(1 / (read_s + b["compute_s_per_token"]), rel=1e-9)
            assert b["of_sum"] == pytest.approx(b["tokens_per_s"] / b["sum_tokens_per_s"], rel=1e-9)
    # --report re-derives the reports from results.json alone
    (out / "results.md").unlink()
    r = run(BENCH + ["--report", str(out)], text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "results.md").read_text() == md


def test_bench_policies_scenario(make_model, tmp_path) -> None:
    """The policies scenario on the calibrated router's token stream: for each budget below every expert, LRU, LFU
    and the adaptive replacement with the even and the planned split run in the library (their measured expert bytes are the replay's, in
    every layer) next to Belady's bound (no policy reads less), one recommendation each, and the report's table."""
    model = _tiny(make_model)
    out = tmp_path / "out"
    r = run(BENCH + ["--model", str(model), "--scenarios", "policies", "--routing", "calibrated", "--budgets",
                     "1/4,1/2,1", "-p", "32", "-n", "24", "-r", "1", "--no-cold", "--sweep-direct-io", "auto",
                     "-o", str(out)], text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["policies"]
    assert [(x["fraction"], x["policy"], x["split"] if x["policy"] != "belady" else "") for x in rows] == [
        (f, p, s) for f in (0.25, 0.5) for p, s in (("lru", "even"), ("lru", "planned"), ("lfu", "even"),
                                                    ("lfu", "planned"), ("adaptive", "even"),
                                                    ("adaptive", "planned"), ("belady", ""))]
    for f in (0.25, 0.5):
        got = [x for x in rows if x["fraction"] == f]
        lib_rows, bound = got[:-1], got[-1]
        assert bound["policy"] == "belady" and "gen_tps" not in bound
        assert all(x["replay_equal"] for x in lib_rows)
        assert all(x["measured_gen_bytes_per_token"] == x["replayed_gen_bytes_per_token"] for x in lib_rows)
        assert all(x["replayed_gen_bytes_per_token"] >= bound["replayed_gen_bytes_per_token"] for x in lib_rows)
        assert sum(x["recommended"] for x in got) == 1 and all(x["routing"] == "calibrated" for x in got)
        assert all(x["gen_tps"] > 0 for x in lib_rows)
    md = (out / "results.md").read_text()
    assert "## Replacement policies and per-layer splits" in md and md.count("| calibrated | ") == len(rows)
    r = run(BENCH + ["--model", str(model), "--routing", "bogus", "-o", str(out)], text=True)
    assert r.returncode != 0 and "unknown routing(s) bogus" in r.stderr


@needs_cap
def test_bench_policies_scenario_under_the_cap(make_model, tmp_path) -> None:
    """With a cgroup, each configuration of the policies scenario runs in a child under the cap, the repetitions
    in alternating order: every repetition reads the replay's bytes, the rows keep each repetition's t/s."""
    model = _tiny(make_model)
    out = tmp_path / "out"
    r = run(BENCH + ["--model", str(model), "--scenarios", "policies", "--routing", "calibrated", "--budgets", "1/4",
                     "-p", "32", "-n", "16", "-r", "2", "--no-cold", "--sweep-direct-io", "auto", "--cap-gib", "2",
                     "-o", str(out)], text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "runs under the 2.00 GiB cap" in r.stderr + r.stdout
    rows = [x for x in json.loads((out / "results.json").read_text())["policies"] if x["policy"] != "belady"]
    assert len(rows) == 6
    for x in rows:
        assert x["capped_gib"] == 2.0 and len(x["gen_tps_runs"]) == 2 and all(t > 0 for t in x["gen_tps_runs"])
        assert x["bytes_equal_across_runs"] and x["replay_equal"]
        assert 0 <= x["gen_wait_ms_per_token"] <= x["gen_ms_per_token"]
        assert x["measured_gen_bytes_per_token"] == x["replayed_gen_bytes_per_token"]
    assert "under the bench's memory cap (2.00 GiB)" in (out / "results.md").read_text()


@needs_cap
def test_bench_memory_cap_and_cold(make_model, tmp_path) -> None:
    model = _tiny(make_model)
    out = tmp_path / "out"
    r = run(BENCH + ["--model", str(model), "--scenarios", "allcached,cap", "--cap-gib", "0.5",
                     "-p", "32", "-n", "8", "--n-gen-capped", "4", "-r", "1", "-o", str(out)], text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    capped = [x for x in res["runs"] if x["scenario"] == "cap"]
    assert {x["load"] for x in capped} == {"mmap", "normal", "longhaul"}
    assert all(x["cap_gib"] == 0.5 and x["status"] == "ok" for x in capped)
    assert all(0 < x["cgroup_peak_gib"] <= 0.5 for x in capped)
    cold = [x for x in capped if x["cold"]]
    assert cold and all(x["disk_gib_read"] is not None for x in cold)
    # a cold longhaul run reads its experts from the file: the library's counter sees them
    assert any(x["expert_gib_read"] and x["expert_gib_read"] > 0 for x in cold)
    ttft = res["analysis"]["ttft_cold"]
    assert {t["load"] for t in ttft} == {"mmap", "longhaul"} and all(t["seconds"] > 0 for t in ttft)
    # the budget --longhaul-cache auto picks inside the cap, and a run at it (the planner's recommendation runs too
    # where the budget leaves experts out and the planner finds something better than the defaults)
    auto = res["cap"]["auto_budget_gib"]
    assert 0 < auto < 0.5
    assert any(x["load"] == "longhaul" and x["budget_bytes"] == round(auto * 2**30) and not x["cold"] for x in capped)
    assert all(x["major_faults_per_token"] is not None and x["major_faults_per_token"] >= 0 for x in capped)
    assert "major faults/token" in (out / "results.md").read_text()
    # no sweep: the plot has nothing to put in a legend, and says nothing about it (a warning is an error here)
    r = run([BENCH[0], "-W", "error::UserWarning"] + BENCH[1:] + ["--report", str(out)], text=True)
    assert r.returncode == 0 and "UserWarning" not in r.stderr, r.stderr[-3000:]
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the page cache needs root")
def test_read_bandwidth_probe(make_model) -> None:
    from longhaul_cpp.disk import expert_slices, read_bandwidth

    model = _tiny(make_model)
    slices, size = expert_slices(model)
    assert slices and size > 0
    bw = read_bandwidth(model, threads=3, total=64 * size)
    assert bw["n_reads"] == min(len(slices), 64) and bw["slice_bytes"] == size
    assert bw["cold_bytes_per_s"] > 0 and bw["reread_bytes_per_s"] > 0
    assert bw["bytes_per_s"] == max(bw["cold_bytes_per_s"], bw["reread_bytes_per_s"])  # the bound: the faster


@needs_cap
def test_reads_bypass_the_page_cache_only_under_a_memory_limit(make_model) -> None:
    """The library reads experts with O_DIRECT when the memory it may still use (MemAvailable, each enclosing
    cgroup's limit minus usage) cannot hold the experts outside its cache, buffered otherwise."""
    import subprocess

    from longhaul_cpp.tools import tool_path

    # 214 MiB of routed experts, one slot per layer cached: about that much streams
    spec = SyntheticSpec(arch="qwen3moe", n_layer=4, n_embd=512, n_head=8, n_head_kv=2, n_expert=64, n_expert_used=2,
                         n_ff_exp=512, expert_type="q8_0", weight_type="q8_0")
    model = make_model(**dataclasses.asdict(spec))[0]
    argv = [str(tool_path("llama-completion")), "-m", str(model), "-p", "hi", "-n", "2", "-no-cnv", "-t", "2",
            "--no-warmup", "-c", "256", "-v", "--longhaul", "--longhaul-cache", str(spec.budget_for(1) / 2**30)]
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_ARG_LONGHAUL_DIRECT_IO"}
    free = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=300)
    assert free.returncode == 0, free.stderr[-2000:]
    assert "0 of 1 shard(s) read with O_DIRECT" in free.stderr  # plenty of memory: the page cache helps
    with MemoryCap(160 * 2**20) as cap:
        capped = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=300,
                                preexec_fn=lambda: cap.add(os.getpid()))
    assert capped.returncode == 0, capped.stderr[-2000:]
    line = next(x for x in capped.stderr.splitlines() if "read with O_DIRECT" in x)
    assert re.search(r"[0-9.]+ (MiB|GiB) of memory available", line), line
    # a filesystem that refuses O_DIRECT (tmpfs) keeps the shard buffered
    assert f"{int(_direct_ok(model))} of 1 shard(s) read with O_DIRECT" in line


def test_run_process_reports_io_and_rss(tmp_path) -> None:
    f = tmp_path / "blob"
    with open(f, "wb") as fh:
        fh.write(os.urandom(4 * 2**20))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: the child reads the disk
    res = run_process([sys.executable, "-c", f"open({str(f)!r}, 'rb').read(); x = bytearray(64 * 2**20); "
                       "x[::4096] = b'1' * len(x[::4096]); import time; time.sleep(0.3)"])
    assert res.status == "ok" and res.returncode == 0
    assert res.major_faults >= 0
    assert res.peak_rss >= 64 * 2**20
    assert res.read_bytes >= 4 * 2**20  # /proc/PID/io of the child, read before it is reaped
    # the tool's own peak, not this process's: a child forked from a big parent is not charged for it
    big = bytearray(300 * 2**20)
    big[::4096] = b"1" * len(big[::4096])
    small = run_process([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert small.peak_rss < 100 * 2**20, small.peak_rss
    del big
    # a mapped file out of the page cache: its pages come in as major faults, counted for the child
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    mapped = run_process([sys.executable, "-c", f"import mmap; fh = open({str(f)!r}, 'rb'); m = mmap.mmap(fh.fileno(), "
                          "0, prot=mmap.PROT_READ); print(sum(m[i] for i in range(0, len(m), 4096)))"])
    assert mapped.status == "ok" and mapped.major_faults > 0, mapped
    bad = run_process([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert bad.status == "failed" and bad.returncode == 3
    slow = run_process([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow.status == "timeout"


def test_budget_fractions() -> None:
    assert parse_fractions("1/16,0.5,1") == (1 / 16, 0.5, 1.0)
    with pytest.raises(ValueError, match="must be in"):
        parse_fractions("2")
    with pytest.raises(ValueError, match="not auto: the budget auto picks depends on the memory free"):
        parse_fractions("1/4,auto")


def test_budget_argument_is_exact() -> None:
    """The GiB string given to --longhaul-cache parses back to exactly the bytes meant."""
    for n in (1, 442368, TINY.budget_for(3), 3 * 2**30 + 12345, 2**53 - 1):
        assert int(float(gib_arg(n)) * 2**30) == n


def test_results_written_before_the_explicit_fields_still_load() -> None:
    """docs/bench/*/results.json predate load/layout/budget_bytes: --report derives them once, from
    the labels those files used."""
    old = {"scenario": "cap", "label": "mmap, plain layout, cold", "routing": "uniform", "test": "tg16",
           "budget_gib": None, "fraction": None, "cap_gib": 1.32, "cold": True, "status": "ok"}
    r = Run.from_dict(old)
    assert (r.load, r.layout, r.budget_bytes) == ("mmap", "plain", None)
    r = Run.from_dict(dict(old, label="longhaul 0.66 GiB, steady", budget_gib=0.5, cold=False))
    assert (r.load, r.layout, r.budget_bytes) == ("longhaul", "repacked", 2**29)


def test_memory_cap_tests_never_skip_under_ci(monkeypatch) -> None:
    """Where no cgroup cap can be made, the memory-cap tests skip on a developer's machine but fail under CI: the
    page-cache accounting and the capped scenarios cannot go untested there without a red run."""
    import conftest

    monkeypatch.setattr(conftest, "can_cap", lambda: False)
    with pytest.raises(pytest.fail.Exception, match="CI: the memory-cap tests cannot run"):
        conftest.check_cap(ci=True)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        conftest.check_cap(ci=False)
    monkeypatch.setattr(conftest, "can_cap", lambda: True)
    conftest.check_cap(ci=True)  # a cap: nothing to say


def test_the_cap_budget_leaves_room_for_what_is_not_cache() -> None:
    """The fixed budget under the cap is the cap less what longhaul keeps besides its cache, measured by the run
    with every expert cached: its peak RSS less the experts it held, which are the routed bytes even when its
    budget (whole slots of each layer's largest expert) is above them. Once it took the budget: a real-scale
    file's budget 1.2 GiB above its experts left a negative rest, and the fixed budget overran the cap."""
    from longhaul_cpp.bench.results import Run
    from longhaul_cpp.bench.runner import non_cache_bytes

    gib = 2**30
    resident, routed = int(0.93 * gib), int(16.35 * gib)
    run = Run(scenario="allcached", label="", load="longhaul", layout="repacked", routing="uniform", test="tg16",
              budget_bytes=int(17.51 * gib), fraction=1.0, cap_gib=None, cold=False, status="ok", peak_rss_gib=17.5)
    assert non_cache_bytes([run], resident, routed) == pytest.approx(17.5 * gib - routed, abs=1)
    # a peak under resident + experts (pages of the resident weights not touched) counts the resident weights
    low = dataclasses.replace(run, peak_rss_gib=17.0)
    assert non_cache_bytes([low], resident, routed) == resident
    # no such run: an estimate above the resident weights
    assert non_cache_bytes([], resident, routed) > resident


@needs_cap
def test_bench_trade_scenario(make_model, tmp_path) -> None:
    """The trade scenario: at a budget below every expert and under the cap and half of it (`auto` inside each),
    the default, the online split off, each policy switch, each in its own process with the repetitions in
    alternating order, and Belady's bytes replayed at the default's budget; the report's table."""
    model = _tiny(make_model)
    out = tmp_path / "out"
    r = run(BENCH + ["--model", str(model), "--scenarios", "trade", "--routing", "calibrated", "--budgets", "1/4,1",
                     "-p", "32", "-n", "16", "-r", "2", "--no-cold", "--trade-caps", "2GiB,1GiB", "-o", str(out)],
            text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["trade"]
    labels = ["0.25 of the experts", "cap 2.00 GiB", "cap 1.00 GiB"]
    configs = ["default", "lru-even", "lfu", "adaptive", "no-repack", "lfu-no-repack", "adaptive-no-repack", "belady"]
    assert [(x["row"].split(" (")[0].replace(", auto", ""), x["config"]) for x in rows] == [
        (lb, c) for lb in labels for c in configs]
    for lb in labels:
        got = [x for x in rows if x["row"].startswith(lb)]
        lib, bound = got[:-1], got[-1]
        assert all(x["error"] is None and len(x["gen_tps_runs"]) == 2 and all(t > 0 for t in x["gen_tps_runs"])
                   for x in lib)
        assert len({x["budget_gib"] for x in lib}) == 1  # every configuration of a row at one budget
        if lb.startswith("cap"):
            assert lib[0]["budget_gib"] < lib[0]["cap_gib"]
        else:
            assert lib[0]["budget_gib"] * 2**30 == TINY.budget_for(4) and lib[0]["cap_gib"] is None
        even = lib[1]
        assert even["slots_min"] == even["slots_max"]  # the online split off: the even split stays
        assert all(x["gen_bytes_per_token"] >= 0 for x in lib) and bound["gen_bytes_per_token"] is not None
        # the time split: the wait at the syncs is part of a generated token's time
        assert all(0 <= x["gen_wait_ms_per_token"] <= x["gen_ms_per_token"] for x in lib)
        # and the reads' own time, shown beside it
        assert all(x["gen_read_ms_per_token"] >= 0 for x in lib)
        # and the conversion into the repacked layout (summed over the reading threads, so not bounded by the read
        # time where this CPU repacks the banks): none with the slots kept plain
        assert all(x["gen_convert_ms_per_token"] >= 0 for x in lib)
        plain = [x for x in lib if x["config"].endswith("no-repack")]
        assert len(plain) == 3 and all(x["gen_convert_ms_per_token"] == 0 for x in plain)
        # Belady's optimum never reads more than LRU at the same (even) split; the prefetch only adds bytes
        assert bound["gen_bytes_per_token"] <= even["gen_bytes_per_token"]
    md = (out / "results.md").read_text()
    assert "## The trade" in md and md.count("| calibrated | ") == len(rows)


def test_trade_configs() -> None:
    """--trade-configs: a subset in the scenario's order, LRU-even always in it (the ratios' baseline); an unknown
    name is refused with the names to choose from, before anything runs."""
    from longhaul_cpp.bench.trade import CONFIG_NAMES, trade_configs

    assert [c[0] for c in trade_configs(None)] == list(CONFIG_NAMES)
    assert [c[0] for c in trade_configs(["adaptive-no-repack", "default"])] == [
        "default", "lru-even", "adaptive-no-repack"]
    with pytest.raises(ValueError, match="unknown configuration.*lfu-no-repack"):
        trade_configs(["lfu", "fastest"])
    r = run(BENCH + ["--model", "medium", "--scenarios", "trade", "--trade-configs", "fastest"], text=True)
    assert r.returncode != 0 and "--trade-configs: unknown configuration(s) fastest" in r.stderr


def test_trade_caps() -> None:
    from longhaul_cpp.bench.trade import cap_limit

    assert cap_limit("1/2", 1000) == 500 and cap_limit("0.25", 1000) == 250 and cap_limit("2GiB", 1) == 2 * 2**30
    for bad in ("3/2", "1/0", "0"):
        with pytest.raises(ValueError, match=r"--trade-caps '.*': a fraction must be in \(0, 1\]"):
            cap_limit(bad, 1000)
    with pytest.raises(ValueError):
        cap_limit("lots", 1000)
