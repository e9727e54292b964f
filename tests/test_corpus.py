"""The corpus of published headers (python/longhaul_cpp/models/corpus) against the unpatched pin.

Each entry is a published GGUF's header: every key and tensor as published. Written at its real scale as a sparse
file (the weights a hole), it is loaded without its weights (no_alloc) by llama-cpp-python 0.3.36, whose library is
the unpatched pin, and by this build. The differential guard: wherever the pin loads a published header, this
build loads it too and prints the same hyperparameters, unless the entry is named below with the reason (a
documented fix of a real abort); and in longhaul mode it loads as well, with the slots per layer `info` predicts, at
2 GiB and at the budget `auto` chooses on this machine (or auto says that not even one slot per layer fits here).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.models import corpus
from longhaul_cpp.models.published import sparse_files_supported
from test_llama_cpp_python import _llama_cpp_python

HERE = Path(__file__).parent
GIB = 1 << 30

# entries the pin loads and this build refuses: name -> why (a fix of a real abort, documented in docs/decisions.md)
REFUSED_BY_DESIGN: dict[str, str] = {}
# architectures this fork adds (the pin does not know them): their published headers must load here
FORK_ARCHS = {"inkling"}


def _load(python: str, module: str, path: Path, *extra: str) -> dict:
    env = dict(os.environ)
    if module == "llama_cpp":
        env.pop("LONGHAUL_CPP_LIB_DIR", None)
    r = subprocess.run([python, str(HERE / "corpus_load.py"), module, str(path), *extra], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip(), f"{module} on {path.name} crashed: {r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _print_info(log: list[str]) -> list[str]:
    """The hyperparameters the loader printed (print_info: lines), as both builds print them."""
    return [line for line in log if line.startswith("print_info:") and "file size" not in line]


def _error(log: list[str]) -> str:
    return next((line for line in log if "error loading model" in line or "failed to load" in line), "")


def test_every_entry_is_consistent() -> None:
    names = corpus.names()
    assert len(names) >= 25, names
    problems = {n: corpus.problems(corpus.load(n)) for n in names}
    assert not {n: p for n, p in problems.items() if p}
    for n in names:
        e = corpus.load(n)
        assert e.raw.get("sources"), f"{n}: no sources"
        # routed experts: banks, or one tensor per expert as 2023's conversions wrote them (Mixtral)
        assert any(re.search(r"_exps\.|ffn_(gate|up|down)\.\d+\.weight", t.name) for t in e.tensors), n


def test_the_guard_sees_a_refusal(tmp_path) -> None:
    """The comparison below can fail: a header the pin refuses (a routed bank with one expert too few) is refused,
    with the loader's reason in the log the guard reads."""
    e = corpus.load("olmoe-1b-7b-0924-instruct-q4_k_m")
    bad = [t if t.name != "blk.0.ffn_up_exps.weight" else corpus.Tensor(t.name, (*t.ne[:2], t.ne[2] - 1), t.type)
           for t in e.tensors]
    broken = corpus.Entry(e.name + "-broken", e.arch, e.shards, e.metadata, tuple(bad), e.raw)
    path = corpus.write_header_file(broken, tmp_path)[0]
    theirs = _load(_llama_cpp_python(), "llama_cpp", path)
    ours = _load(sys.executable, "longhaul_cpp", path)
    assert not theirs["ok"] and "blk.0.ffn_up_exps.weight" in _error(theirs["log"])
    assert not ours["ok"] and "blk.0.ffn_up_exps.weight" in ours["error"]


@pytest.mark.long  # every published header at real scale, in both builds
def test_published_headers_load_as_the_pin_loads_them(tmp_path) -> None:
    if not sparse_files_supported(tmp_path):
        pytest.skip("this filesystem keeps no holes: the real-scale headers would take their full size")
    lcp = _llama_cpp_python()
    failures, table = [], []
    for name in corpus.names():
        e = corpus.load(name)
        out = tmp_path / name
        paths = corpus.write_header_file(e, out)
        try:
            theirs = _load(lcp, "llama_cpp", paths[0])
            ours = _load(sys.executable, "longhaul_cpp", paths[0])
            row = [name, e.arch, "loads" if theirs["ok"] else "refused", "loads" if ours["ok"] else "refused", "-"]
            if theirs["ok"] and not ours["ok"] and name not in REFUSED_BY_DESIGN:
                failures.append(f"{name}: the pin loads it, this build refuses it: {ours['error']}")
            elif e.arch in FORK_ARCHS and not ours["ok"]:
                failures.append(f"{name}: a published {e.arch} file (this fork's architecture) is refused: "
                                f"{ours['error']}")
            elif theirs["ok"] and ours["ok"] and _print_info(theirs["log"]) != _print_info(ours["log"]):
                diff = sorted(set(_print_info(theirs["log"])) ^ set(_print_info(ours["log"])))
                failures.append(f"{name}: hyperparameters differ: {diff[:6]}")
            if ours["ok"]:
                # longhaul at 2 GiB, or at one slot per layer where 2 GiB is less: loads, with the slots per layer
                # `info` gives for that budget
                info = inspect_model(paths[0])
                budget = max(2 * GIB, info.min_budget)
                lh = _load(sys.executable, "longhaul_cpp", paths[0], "longhaul", str(budget))
                if lh["ok"]:
                    row[4] = f"{min(lh['slots'])}-{max(lh['slots'])} slots at {budget / GIB:.2f} GiB"
                    if lh["slots"] != list(info.slots(budget).values()):
                        failures.append(f"{name}: longhaul gives slots {lh['slots']}, info says {info.slots(budget)}")
                else:
                    row[4] = "refused"
                    failures.append(f"{name}: longhaul at {budget} B refuses it: {lh['error']}")
                # auto: the budget the dry runs choose on this machine, and the load at it, with info's slots; or
                # the refusal that names the shortfall where not even one slot per layer fits (a model whose
                # resident weights are more than this machine has)
                au = _load(sys.executable, "longhaul_cpp", paths[0], "longhaul", "auto")
                if au["ok"]:
                    row.append(f"auto {au['budget'] / GIB:.2f} GiB: {min(au['slots'])}-{max(au['slots'])} slots")
                    if au["slots"] != list(info.slots(au["budget"]).values()):
                        failures.append(f"{name}: auto gives slots {au['slots']}, info says "
                                        f"{info.slots(au['budget'])} at {au['budget']} B")
                elif "not even one expert slot per routed MoE layer fits" in au["error"]:
                    row.append("auto: does not fit here")
                else:
                    failures.append(f"{name}: auto fails: {au['error']}")
            table.append(row)
        finally:
            for p in paths:
                p.unlink()
    print("\n".join(" | ".join(r) for r in table))
    assert not failures, "\n".join(failures)


def test_cli_writes_a_published_header_that_info_reads(tmp_path) -> None:
    """`longhaul-cpp published NAME DIR` writes a corpus entry's header (sparse), and `info` gives its slots."""
    if not sparse_files_supported(tmp_path):
        pytest.skip("this filesystem keeps no holes")
    name = "minimax-m2.7-ud-iq3_s"  # not one of the generator's PUBLISHED layouts (a name in both writes that one)
    r = subprocess.run([sys.executable, "-m", "longhaul_cpp", "published", name, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    paths = [Path(p) for p in r.stdout.split()]
    assert len(paths) == 3 and sum(p.stat().st_size for p in paths) > 77 * GIB
    assert sum(p.stat().st_blocks * 512 for p in paths) < 64 << 20
    path = paths[0]
    r = subprocess.run([sys.executable, "-m", "longhaul_cpp", "info", str(path), "--longhaul-cache", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    slots = inspect_model(path).slots(2 * GIB)
    assert len(slots) == 62 and f"{min(slots.values())}" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "longhaul_cpp", "published", name, str(tmp_path), "--data", "random"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "its weights are not known" in r.stderr


def test_shards_are_cut_by_size_and_never_empty() -> None:
    from longhaul_cpp.models.shards import cut

    assert cut([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert cut([1, 100, 1, 1, 1], 3) == [0, 0, 1, 2, 2]  # the large tensor spans two thirds: shard 1 is not empty
    assert cut([1, 1], 3) == [0, 1]  # fewer tensors than shards: a shard stays empty (as a published split may)
    rng = __import__("random").Random(0)
    for _ in range(200):
        sizes = [rng.choice([1, 10, 1000]) for _ in range(rng.randint(3, 30))]
        n = rng.randint(2, len(sizes))
        shard_of = cut(sizes, n)
        assert sorted(set(shard_of)) == list(range(n)) and shard_of == sorted(shard_of)
