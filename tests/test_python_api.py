"""The Python package's higher-level API: Context.generate(), `info`, and resource use over many models."""
from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys

import pytest

from longhaul_cpp import LoadMode, Model, SyntheticSpec
from longhaul_cpp.longhaul import parse_cache_size
from longhaul_cpp.modelinfo import inspect_model

from conftest import run


@pytest.fixture(scope="module")
def model(make_model):
    return make_model(arch="qwen35moe", expert_type="q8_0")[0]


def test_generate_greedy_equals_token_greedy(model) -> None:
    with Model(model) as m:
        with m.context(n_ctx=256) as ctx:
            text = ctx.generate("hello", max_tokens=16)
        with m.context(n_ctx=256) as ctx:
            ids = list(ctx.greedy(m.tokenize("hello"), 16))
        assert isinstance(text, str) and text == m.detokenize(ids)


def test_generate_streams_the_same_text(model) -> None:
    with Model(model) as m:
        with m.context(n_ctx=256) as ctx:
            full = ctx.generate("stream me", max_tokens=20)
        with m.context(n_ctx=256) as ctx:
            pieces = list(ctx.generate("stream me", max_tokens=20, stream=True))
        assert len(pieces) > 1 and "".join(pieces) == full


def test_generate_sampling_is_seeded(model) -> None:
    with Model(model) as m:
        outs = []
        for seed in (1, 1, 2):
            with m.context(n_ctx=256) as ctx:
                outs.append(ctx.generate("sample", max_tokens=24, temperature=1.0, seed=seed))
        assert outs[0] == outs[1] and outs[0] != outs[2]
        with m.context(n_ctx=256) as ctx, pytest.raises(ValueError):
            ctx.generate("x", temperature=-1)


def test_info_matches_the_library(make_model, caplog) -> None:
    spec = SyntheticSpec(arch="laguna", expert_type="q4_0", n_expert=16, n_expert_used=4)
    paths = make_model(n_shards=3, **dataclasses.asdict(spec))
    info = inspect_model(paths[0])
    assert info.arch == "laguna" and info.supported and len(info.shards) == 3
    assert set(info.expert_bytes) == set(spec.moe_layers())
    assert all(b == spec.expert_bytes() for b in info.expert_bytes.values())
    assert info.min_budget == spec.budget_for(1)
    budget = info.min_budget * 3 + 5  # 3 slots per layer: fewer than top-4, staged
    with Model(paths[0], load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget) as m:
        stats = m.longhaul_stats()
        with m.context(n_ctx=256, n_ubatch=512) as ctx:
            n_ubatch = ctx.n_ubatch
    assert {l.il: l.n_slots for l in stats.layers} == info.slots(budget)
    assert info.effective_ubatch(budget) == n_ubatch == 1
    assert info.stages(budget) == 2
    # 6 slots of 16: a full ubatch runs in expert waves, as many as the library logs
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"):
        with Model(paths[0], load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget * 2) as m, \
                m.context(n_ctx=512, n_batch=512, n_ubatch=512) as ctx:
            assert ctx.n_ubatch == 512
    assert info.waves(budget * 2, 512) >= 3
    assert f"routed MoE runs in up to {info.waves(budget * 2, 512)} expert waves" in caplog.text
    assert info.effective_ubatch(budget * 2) == 512
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(paths[0]), "--longhaul-cache", f"{budget}B"], text=True)
    assert r.returncode == 0, r.stderr
    assert "longhaul:       supported" in r.stdout and "3 slots per layer" in r.stdout
    assert "effective n_ubatch 1" in r.stdout and "2 stage(s)" in r.stdout
    # a budget that leaves experts out says which replacement to try; one that holds every expert does not
    assert "replacement:    3 of 16 experts per layer fit" in r.stdout and "--longhaul-policy adaptive" in r.stdout
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(paths[0]), "--longhaul-cache",
             f"{info.budget_for(16)}B"], text=True)
    assert r.returncode == 0 and "16 slots per layer" in r.stdout and "replacement:" not in r.stdout, r.stdout
    # the minimum it prints, as a size the tools' --longhaul-cache takes, is exactly one slot per layer
    m = re.search(r"minimum budget: .*\(--longhaul-cache ([0-9.]+[KMG]iB|[0-9]+B)\)", r.stdout)
    assert m, r.stdout
    printed = parse_cache_size(m.group(1))
    assert 0 <= printed - info.min_budget < info.min_budget / 100 and set(info.slots(printed).values()) == {1}
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(paths[0]), "--longhaul-cache", "1000B"], text=True)
    assert r.returncode == 1 and "too small" in r.stdout


def test_info_names_a_missing_shard(tmp_path, make_model) -> None:
    path = make_model(n_shards=3, arch="qwen3moe")[0]
    broken = tmp_path / path.name
    broken.write_bytes(path.read_bytes())
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(broken)], text=True)
    assert r.returncode == 2 and "missing shard" in r.stderr


LEAK_SCRIPT = r"""
import sys
from longhaul_cpp import LoadMode, Model

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

path = sys.argv[1]
def cycle():
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=1) as m:
        with m.context(n_ctx=128, n_threads=1) as ctx:
            ctx.decode(m.tokenize("leak check"))
for _ in range(20):
    cycle()
for _ in range(3):  # three windows of 100 cycles
    before = rss()
    for _ in range(100):
        cycle()
    print(rss() - before)
"""


def test_no_leak_over_open_close_cycles(model) -> None:
    """320 open/close cycles of a longhaul model. The allocator moves RSS by several MiB either way
    between windows (measured: -2.6 .. +8.5 MiB over 180 cycles, -1.3 over 540), so a leak is growth
    in every window: the smallest of three 100-cycle windows must stay under 2 MiB (20 KiB a cycle)."""
    r = subprocess.run([sys.executable, "-c", LEAK_SCRIPT, str(model)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    growth = [int(x) for x in r.stdout.split()[-3:]]
    assert min(growth) < 2 * 2**20, f"RSS grew in every 100-cycle window: {[g / 2**20 for g in growth]} MiB"


def test_library_refuses_the_auto_placeholder(make_model) -> None:
    """UINT64_MAX is the tools' placeholder for --longhaul-cache auto; a program that passes it to the library
    without resolving it is refused, not given every expert."""
    import os

    from longhaul_cpp import LlamaError, lib
    from longhaul_cpp._lib import ffi, log_mark, raise_error

    path = make_model(arch="qwen3moe")[0]
    p = lib().llama_model_default_params()
    p.load_mode, p.longhaul_cache_bytes = LoadMode.LONGHAUL, 2**64 - 1  # past Python's own check, as a C caller
    mark = log_mark()
    assert lib().llama_model_load_from_file(os.fsencode(path), p) == ffi.NULL
    with pytest.raises(LlamaError, match="UINT64_MAX, the placeholder of --longhaul-cache auto"):
        raise_error("refused", mark)


def test_budget_in_bytes(make_model) -> None:
    """longhaul_cache_bytes=N takes the budget as a number of bytes (no "NB" string); given with longhaul_cache,
    out of range, or without longhaul, it is refused by name."""
    path = make_model(arch="qwen3moe")[0]
    n = inspect_model(path).budget_for(3)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=n) as m:
        assert m.longhaul_budget == n and all(layer.n_slots == 3 for layer in m.longhaul_stats().layers)
    for kw in ({"longhaul_cache": 1, "longhaul_cache_bytes": n}, {}, {"longhaul_cache_bytes": 0},
               {"longhaul_cache_bytes": 2**64 - 1}, {"longhaul_cache_bytes": True}, {"longhaul_cache_bytes": 1.5}):
        with pytest.raises(ValueError, match="longhaul_cache"):
            Model(path, load_mode=LoadMode.LONGHAUL, **kw)
    with pytest.raises(ValueError, match="only used with load_mode=LoadMode.LONGHAUL"):
        Model(path, longhaul_cache_bytes=n)


def test_verbose_llama_prints_the_plan(make_model, caplog) -> None:
    from longhaul_cpp import Llama

    path = make_model(arch="qwen3moe")[0]
    info = inspect_model(path)
    with caplog.at_level(logging.INFO, logger="longhaul_cpp"):
        with Llama(path, load_mode="longhaul", longhaul_cache="auto", n_ctx=256):
            pass
    assert re.search(r"longhaul: longhaul_cache='auto' chose [0-9.]+[KMG]iB .* available - resident weights",
                     caplog.text), caplog.text
    assert re.search(rf"longhaul: budget [0-9.]+[KMG]iB, \d+ slots per layer in {len(info.expert_bytes)} routed MoE "
                     r"layers \(.* of slots\); prompts: ", caplog.text), caplog.text


QUIET_SCRIPT = r"""
import sys
from longhaul_cpp import LlamaError, LoadMode, Model
try:
    Model(sys.argv[1], load_mode=LoadMode.LONGHAUL, longhaul_cache="1B")
except LlamaError as e:
    print(e)
"""


def test_quiet_by_default_the_exception_keeps_the_reason(make_model) -> None:
    """Without logging configured, the library's errors do not reach stderr; the exception carries them."""
    path = make_model(arch="qwen3moe")[0]
    r = run([sys.executable, "-c", QUIET_SCRIPT, str(path)], text=True)
    assert r.returncode == 0 and "less than one expert slot" in r.stdout, r.stdout + r.stderr
    assert r.stderr.strip() == "", r.stderr


def test_info_names_the_tensor_a_truncated_file_cuts(tmp_path, make_model) -> None:
    path = make_model(arch="qwen3moe")[0]
    cut = tmp_path / "cut.gguf"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) - 4096])
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(cut)], text=True)
    assert r.returncode == 2 and re.search(r"tensor '[^']+' lies outside the file .* truncated", r.stderr), r.stderr
    cut.write_bytes(data[:64])  # the header itself cut
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(cut)], text=True)
    assert r.returncode == 2 and "header is cut short" in r.stderr, r.stderr
    r = run([sys.executable, "-m", "longhaul_cpp", "info", str(tmp_path / "absent.gguf")], text=True)
    assert r.returncode == 2 and "model file not found" in r.stderr and "shard" not in r.stderr, r.stderr
