"""`--longhaul-cache auto` / `longhaul_cache="auto"`: the largest budget that fits in the memory the process
may still use, its logged breakdown, and its refusal with the shortfall; under a cgroup cap when root."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import needs_cap
from longhaul_cpp import LlamaError, LoadMode, Model, SyntheticSpec, fit_longhaul_cache
from longhaul_cpp.bench import MemoryCap, run_process
from longhaul_cpp.longhaul import policy_hint
from longhaul_cpp.tools import tool_path

MIB = 2**20

# 214 MiB of routed experts (test_bench's model: generated once per session)
BIG = SyntheticSpec(arch="qwen3moe", n_layer=4, n_embd=512, n_head=8, n_head_kv=2, n_expert=64, n_expert_used=2,
                    n_ff_exp=512, expert_type="q8_0", weight_type="q8_0")
TINY = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")


def _model(make_model, spec: SyntheticSpec) -> Path:
    return make_model(**dataclasses.asdict(spec))[0]


def _completion(model: Path, log: Path, *extra: str) -> list[str]:
    return [str(tool_path("llama-completion")), "-m", str(model), "-p", "The quick brown fox jumps over", "-n", "12",
            "-no-cnv", "-t", "2", "-c", "256", "--temp", "0", "-v", "--log-file", str(log), *extra]


_FIT = re.compile(r"--longhaul-cache auto chose ([0-9.]+) (B|KiB|MiB|GiB|TiB) \((\d+) of (\d+) experts per layer")
_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _fitted(log: str) -> tuple[float, int]:
    """The chosen budget (bytes) and the fewest slots of a layer, from the library's log line."""
    m = _FIT.search(log)
    assert m, log[-3000:]
    return float(m.group(1)) * _UNIT[m.group(2)], int(m.group(3))


def test_fit_breakdown_adds_up_and_loads(make_model) -> None:
    model = _model(make_model, TINY)
    fit = fit_longhaul_cache(model, context_params={"n_ctx": 1024})
    assert fit.available > 0 and fit.resident > 0 and fit.context > 0 and fit.compute > 0 and fit.io >= 0
    assert fit.headroom == max(64 * MIB, fit.available // 20)
    assert fit.min_budget == TINY.budget_for(1) and fit.max_budget == TINY.budget_for(TINY.n_expert)
    assert fit.min_budget <= fit.budget <= fit.max_budget and fit.cache <= fit.budget
    assert fit.budget + fit.resident + fit.context + fit.compute + fit.io + fit.headroom <= fit.available
    # a bigger context costs KV cache
    assert fit_longhaul_cache(model, context_params={"n_ctx": 4096}).context > fit.context
    with Model(model, load_mode=LoadMode.LONGHAUL, longhaul_cache="auto", context_params={"n_ctx": 1024}) as m:
        assert m.longhaul_fit is not None and m.longhaul_fit.budget == fit.budget
        assert m.longhaul_stats().total.cache_bytes == fit.cache


def test_read_buffers_are_what_the_load_uses(make_model) -> None:
    """The measurement's read buffers are the ones the load allocates: none for reads through the page cache into
    plain slots, the largest slice (padded to 64 KiB) per reader and the caller for staged writes, 4 MiB each with
    O_DIRECT (before: 4 MiB each whatever the load used)."""
    from longhaul_cpp import LonghaulFlag
    from longhaul_cpp.longhaul import plain_expert_banks
    from longhaul_cpp.modelinfo import inspect_model

    model = _model(make_model, TINY)
    info = inspect_model(model)
    slice_bytes = max(info.expert_bytes.values()) // 3  # gate, up and down of one expert: the same shape
    chunk = -(-min(4 * MIB, slice_bytes) // (64 * 2**10)) * 64 * 2**10
    readers = 2 + 1  # longhaul_io_threads, and the caller reads too

    def io(flags: LonghaulFlag) -> int:
        return fit_longhaul_cache(model, context_params={"n_ctx": 256}, longhaul_flags=flags, longhaul_io_threads=2).io

    with plain_expert_banks():
        assert io(LonghaulFlag.NO_DIRECT_IO) == 0
        assert io(LonghaulFlag.NO_DIRECT_IO | LonghaulFlag.STAGED) == chunk * readers
        assert io(LonghaulFlag.DIRECT_IO) == 4 * MIB * readers


def test_auto_finds_the_most_slots_when_shrinking_does_not_settle(monkeypatch) -> None:
    """Where the compute buffers grow as the slots shrink, the shrink loop does not settle and auto halves slot
    counts: it finds the most whole slots that fit, measured, and never more (before: up to 1/256 of the range
    below, from an unmeasured upper end)."""
    from longhaul_cpp import fit as fit_mod

    unit, n_expert, avail = 16 * MIB, 1024, 100 * 2**30

    def fake(path, mparams, cparams, budget):  # compute falls by 0.9 of each byte the slots take: 0.1 net
        slots = min(budget // unit, n_expert)
        cache = slots * unit
        return fit_mod.CacheFit(budget=budget, available=avail, resident=2**30, context=2**30,
                                compute=40 * 2**30 - (cache * 9) // 10 + 2**30, io=0,
                                headroom=max(fit_mod.HEADROOM_MIN, avail // fit_mod.HEADROOM_DIV), cache=cache,
                                min_budget=unit, max_budget=n_expert * unit, n_slots=slots, n_expert=n_expert,
                                source="test")

    def need(n: int) -> int:
        f = fake(None, None, None, n * unit)
        return f.others + f.cache

    for total in (45.5, 45.9, 46.6):  # GiB: 144, 387 and 812 slots fit (the old halving gave 143, 385, 809)
        avail = int(total * 2**30)
        monkeypatch.setattr(fit_mod, "_measure", fake)
        got = fit_mod.fit_budget(Path("m.gguf"), None, None)
        best = max(n for n in range(1, n_expert + 1) if need(n) <= avail)
        assert got.budget // unit == best and got.budget % unit == 0, (total, got.budget / unit, best)
        assert got.others + got.cache <= avail


def test_auto_argument_errors(make_model) -> None:
    model = _model(make_model, TINY)
    with pytest.raises(ValueError, match="nothing to choose"):
        Model(model, load_mode=LoadMode.LONGHAUL, longhaul_cache="auto", longhaul_layer_slots=[1, 1, 1, 1])
    with pytest.raises(ValueError, match="only used with longhaul_cache='auto'"):
        Model(model, load_mode=LoadMode.LONGHAUL, longhaul_cache=1, context_params={"n_ctx": 512})
    with pytest.raises(ValueError, match="only used with load_mode=LoadMode.LONGHAUL"):
        Model(model, longhaul_cache="auto")
    with pytest.raises(TypeError, match="unknown llama_context_params field 'n_context'"):
        fit_longhaul_cache(model, context_params={"n_context": 512})


def test_auto_on_the_command_line(make_model, tmp_path) -> None:
    model = _model(make_model, TINY)
    r = subprocess.run(_completion(model, tmp_path / "log.txt", "--longhaul", "--longhaul-cache", "AUTO"),
                       capture_output=True, encoding="utf-8", errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "log.txt").read_text(errors="replace")
    budget, n_slots = _fitted(log)
    assert n_slots == TINY.n_expert  # this machine holds a tiny model's experts whole
    assert "resident weights" in log and "KV cache" in log and "headroom" in log
    # the environment variable takes it too
    env = dict(os.environ, LLAMA_ARG_LONGHAUL_CACHE="auto")
    r2 = subprocess.run(_completion(model, tmp_path / "log2.txt", "--longhaul"), capture_output=True, encoding="utf-8", errors="replace",
                        timeout=300, env=env)
    assert r2.returncode == 0 and r2.stdout == r.stdout, r2.stderr[-3000:]
    bad = subprocess.run(_completion(model, tmp_path / "log3.txt", "--longhaul", "--longhaul-cache", "automatic"),
                         capture_output=True, encoding="utf-8", errors="replace", timeout=300)
    assert bad.returncode != 0 and "automatic" in bad.stderr


@needs_cap
def test_auto_stays_inside_a_memory_cap(make_model, tmp_path) -> None:
    """Under a 192 MiB cap the 214 MiB of experts cannot all be cached: auto picks a budget between one slot
    and every expert, the prompt and generation run without reaching the cap's OOM killer, the process's
    own peak stays inside the cap, and the output is that of an uncapped run."""
    model = _model(make_model, BIG)
    cap_bytes = 192 * MIB
    with MemoryCap(cap_bytes) as cap:
        res = run_process(_completion(model, tmp_path / "capped.txt", "--longhaul", "--longhaul-cache", "auto"),
                          cap=cap, timeout=600)
        oom = cap.oom_killed()
    log = (tmp_path / "capped.txt").read_text(errors="replace")
    assert res.returncode == 0 and not oom, (res.status, log[-3000:])
    budget, n_slots = _fitted(log)
    assert BIG.budget_for(1) <= budget < BIG.budget_for(BIG.n_expert)  # the cap, not the machine, decided
    assert 1 <= n_slots < BIG.n_expert
    assert res.peak_rss <= cap_bytes
    # the cache fills most of the cap: the rest cannot hold the streamed experts, so they bypass the page cache
    try:  # (a filesystem that refuses O_DIRECT, tmpfs, keeps the shard buffered)
        os.close(os.open(model, os.O_RDONLY | os.O_DIRECT))
        direct_ok = True
    except OSError:
        direct_ok = False
    assert f"{int(direct_ok)} of 1 shard(s) read with O_DIRECT" in log
    free = run_process(_completion(model, tmp_path / "free.txt", "--longhaul", "--longhaul-cache", "1"), timeout=600)
    assert free.returncode == 0 and free.stdout == res.stdout


@needs_cap
def test_auto_refused_with_the_shortfall(make_model, tmp_path) -> None:
    model = _model(make_model, BIG)
    with MemoryCap(48 * MIB) as cap:
        res = run_process(_completion(model, tmp_path / "log.txt", "--longhaul", "--longhaul-cache", "auto"),
                          cap=cap, timeout=600)
        oom = cap.oom_killed()
    log = (tmp_path / "log.txt").read_text(errors="replace")
    assert res.returncode == 1 and not oom, (res.status, log[-3000:])
    m = re.search(r"not even one expert slot per routed MoE layer fits: .* the smallest budget is ([0-9.]+ [KMGT]?i?B): "
                  r"([0-9.]+) [KMGT]?i?B short", log)
    assert m, log[-3000:]
    assert float(m.group(2)) > 0 and "the memory limit of cgroup" in log


@needs_cap
def test_a_fixed_budget_the_cap_cannot_hold_is_refused_at_load(make_model, tmp_path) -> None:
    """A fixed budget above the memory the cgroup leaves (every expert, 214 MiB, under a 160 MiB cap) fails the
    load with the numbers and a budget that fits, instead of the OOM killer ending a decode once enough experts
    were read; the budget it names then runs under the same cap (issue 46, item 5)."""
    model = _model(make_model, BIG)
    every = str(BIG.budget_for(BIG.n_expert) / 2**30)
    with MemoryCap(160 * MIB) as cap:
        res = run_process(_completion(model, tmp_path / "log.txt", "--longhaul", "--longhaul-cache", every), cap=cap,
                          timeout=600)
        oom = cap.oom_killed()
    log = (tmp_path / "log.txt").read_text(errors="replace")
    assert res.returncode == 1 and not oom, (res.status, log[-3000:])
    m = re.search(r"longhaul: the expert cache \(([0-9.]+) MiB\) and its read buffers \([0-9.]+ [KM]iB\) need more "
                  r"than the ([0-9.]+) MiB this process may still use \(the memory limit of cgroup [^)]+\): filling "
                  r"the cache would get the process killed; use a budget below ([0-9.]+) MiB", log)
    assert m, log[-3000:]
    assert float(m.group(1)) > float(m.group(2)) > float(m.group(3)) > 0
    fits = f"{float(m.group(3)) * 0.6:.1f}MiB"  # room for the context besides
    with MemoryCap(160 * MIB) as cap:
        ok = run_process(_completion(model, tmp_path / "ok.txt", "--longhaul", "--longhaul-cache", fits), cap=cap,
                         timeout=600)
        oom = cap.oom_killed()
    assert ok.returncode == 0 and not oom, (ok.status, (tmp_path / "ok.txt").read_text(errors="replace")[-3000:])


def test_fit_refusal_is_a_llama_error(make_model) -> None:
    """Without a cap, a huge context (KV cache beyond the machine) is what leaves no room."""
    model = _model(make_model, TINY)
    with pytest.raises(LlamaError, match=r"no longhaul cache budget fits .*short"):
        fit_longhaul_cache(model, context_params={"n_ctx": 2**26})  # 32 GiB of KV cache


def test_server_with_auto_reports_the_chosen_budget(make_model) -> None:
    import json
    import urllib.request

    from test_tools_longhaul import server

    model = _model(make_model, TINY)
    fit = fit_longhaul_cache(model, context_params={"n_ctx": 4096, "n_seq_max": 4})
    with server(model, "--longhaul", "--longhaul-cache", "auto") as base:
        with urllib.request.urlopen(base + "/props", timeout=10) as resp:
            lh = json.loads(resp.read())["longhaul"]
    # the server's budget is the one chosen for its own context (4096 tokens, 4 slots): every expert here
    assert lh["cache_bytes"] == fit.max_budget == TINY.budget_for(TINY.n_expert)
    assert 0 < lh["cache_budget_gib"] * 2**30 <= fit.available


def test_help_documents_auto() -> None:
    r = subprocess.run([str(tool_path("llama-completion")), "--help"], capture_output=True, encoding="utf-8",
                       errors="replace", timeout=60)
    assert "or auto (the largest that fits in the memory available" in r.stdout


def test_info_plans_the_auto_budget(make_model, capsys) -> None:
    from longhaul_cpp.cli import main

    model = _model(make_model, TINY)
    assert main(["info", str(model), "--longhaul-cache", "auto", "-c", "1024"]) == 0
    out = capsys.readouterr().out
    fit = fit_longhaul_cache(model, context_params={"n_ctx": 1024, "n_ubatch": 512})
    assert f"auto budget:    {fit.budget / 2**20:.2f} MiB" in out
    assert f"{TINY.n_expert} slots per layer" in out  # a tiny model's experts fit whole
    # a refusal is an error exit with the library's message
    assert main(["info", str(model), "--longhaul-cache", "auto", "-c", str(2**26)]) == 1
    assert "short" in capsys.readouterr().err


AVAIL_SCRIPT = r"""
import sys
from longhaul_cpp import fit_longhaul_cache

def available():
    return fit_longhaul_cache(sys.argv[1], context_params={"n_ctx": 256}).available

out = [available()]
for path in sys.argv[2:]:
    for _ in range(2):  # read twice: the file's pages become active in the cgroup's page cache
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    out.append(available())
print(*out)
"""


@needs_cap
def test_page_cache_of_the_model_is_free_and_of_others_used(make_model, tmp_path) -> None:
    """In a container, the model's own file pages (its GGUF read twice: active in the cgroup's page cache) still
    count as available, which the kernel reclaims before it kills anything; another file's active pages are that
    reader's working set and count as used (before, both counted as available)."""
    import sys

    model = _model(make_model, BIG)
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:
        for _ in range(256):
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
    for path in (model, data):  # out of the page cache: the capped process's reads bring them in, charged to it
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    size = model.stat().st_size
    assert size > 192 * MIB
    with MemoryCap(1536 * MIB) as cap:
        res = run_process([sys.executable, "-c", AVAIL_SCRIPT, str(model), str(model), str(data)], cap=cap,
                          timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    before, after_model, after_data = (int(x) for x in res.stdout.split())
    assert after_model > before - 48 * MIB, (before / MIB, after_model / MIB)
    assert after_data < after_model - 192 * MIB, (after_model / MIB, after_data / MIB)


_CHOSE = re.compile(r"auto chose ([0-9.]+) (B|KiB|MiB|GiB|TiB) \((\d+) of \d+ experts per layer at least\): "
                    r"([0-9.]+) (B|KiB|MiB|GiB|TiB) available .* KV cache ([0-9.]+) (B|KiB|MiB|GiB|TiB) - compute "
                    r"([0-9.]+) (B|KiB|MiB|GiB|TiB)")


@needs_cap
def test_python_and_the_tools_choose_alike(make_model, tmp_path, monkeypatch) -> None:
    """One policy in two languages (common_longhaul_fit in common, longhaul_cpp.fit in Python, both on the library's
    llama_longhaul_measure): given the memory the tool saw, Python's search picks the tool's budget, where a cap
    decides it (printed to 0.01 of its unit: compared within that)."""
    from longhaul_cpp import fit as fit_mod

    model = _model(make_model, BIG)
    with MemoryCap(192 * MIB) as cap:
        res = run_process(_completion(model, tmp_path / "log.txt", "--longhaul", "--longhaul-cache", "auto"),
                          cap=cap, timeout=600)
    log = (tmp_path / "log.txt").read_text(errors="replace")
    m = _CHOSE.search(log)
    assert res.returncode == 0 and m, log[-3000:]
    size = lambda i: float(m.group(i)) * _UNIT[m.group(i + 1)]  # noqa: E731
    budget, avail = size(1), int(size(4))
    assert BIG.budget_for(1) <= budget < BIG.budget_for(BIG.n_expert)
    # experts left out: the log says which replacement to try, the library's line `longhaul-cpp info` prints too
    assert policy_hint(int(m.group(3)), BIG.n_expert) in log, log[m.end():m.end() + 1500]
    real = fit_mod._measure

    # the read buffers too: the load under the cap reads with O_DIRECT (4 MiB each), this process has the memory
    io = re.search(r"read buffers ([0-9.]+) (B|KiB|MiB|GiB)", m.group(0) + log[m.end():m.end() + 200])
    assert io, log[m.start():m.end() + 200]
    io_bytes = round(float(io.group(1)) * _UNIT[io.group(2)])

    def pinned(*args):
        f = real(*args)
        return dataclasses.replace(f, available=avail, io=io_bytes,
                                   headroom=max(fit_mod.HEADROOM_MIN, avail // fit_mod.HEADROOM_DIV))

    monkeypatch.setattr(fit_mod, "_measure", pinned)
    py = fit_longhaul_cache(model, context_params={"n_ctx": 256, "n_batch": 2048, "n_ubatch": 512})
    # the same context (KV cache, compute buffers as the tool printed them), the same slots, the same budget
    assert abs(py.context - size(6)) <= 0.01 * MIB and abs(py.compute - size(8)) <= 0.01 * MIB, (py, m.group(0))
    assert py.n_slots == int(m.group(3)) and abs(py.budget - budget) <= 0.01 * MIB + 0.005 * budget, (py, m.group(0))
