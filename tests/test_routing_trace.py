"""Routing traces from elsewhere (`longhaul-cpp plan --routing FILE`, docs/routing-trace.md): a hand-made trace
whose misses are known gives them, our own recording written out (`--save-routing`) replays to the same bytes and
recommendation as the run itself, and a malformed trace is refused with the line and what is wrong."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp import SyntheticSpec
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.plan import predict, record_run
from longhaul_cpp.plan.recommend import recommend
from longhaul_cpp.plan.trace import TraceError, load_routing, save_routing

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=32, n_expert_used=4, expert_type="q8_0")
HEAD = "longhaul-routing 1\nn_expert 4\nn_expert_used 2\nexpert_bytes * 1000\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longhaul_cpp", *args], capture_output=True, text=True, timeout=600)


def _known(tmp_path: Path) -> Path:
    """Two layers of 4 experts, top-2, six generated tokens: layer 0 alternates {0,1} and {2,3} (at two slots
    every token misses both, at four none), layer 1 always selects {0,1} (no miss once warm). Lines shuffled:
    order is taken from the positions."""
    lines = [f"g {pos} 0 " + ("0 1" if pos % 2 == 0 else "3 2") for pos in range(6)]
    lines += [f"g {pos} 1 1 0  # layer 1" for pos in range(6)]
    np.random.default_rng(0).shuffle(lines)
    path = tmp_path / "known.trace"
    path.write_text(HEAD + "# a comment line\n\n" + "\n".join(lines) + "\n")
    return path


def test_a_hand_made_trace_gives_its_known_misses(tmp_path) -> None:
    run, info = load_routing(_known(tmp_path))
    assert (run.n_prompt, run.n_gen, run.calls) == (0, 6, [1] * 6)
    assert info.expert_bytes == {0: 1000, 1: 1000} and info.budget_for(2) == 4000
    assert run.routing.layers[0][:2].tolist() == [[0, 1], [3, 2]]
    rows = {r.n_slots: r for r in predict(run, info, bandwidth=1000.0)}
    # two slots: layer 0 misses 2 of 2 per token, layer 1 none: 2000 bytes per token, half the selections hit
    assert rows[2].mib_per_token_gen * 2**20 == pytest.approx(2000) and rows[2].hit_lru_gen == 0.5
    assert rows[2].hit_opt_gen == 0.5  # no policy does better with two slots
    assert rows[2].gen_tps == pytest.approx(0.5)  # 2000 bytes per token at 1000 B/s, no compute in a trace
    assert rows[4].hit_lru_gen == 1.0 and rows[4].mib_per_token_gen == 0 and rows[4].gen_tps is None
    rec = recommend(run, info, info.budget_for(2), 1000.0)
    assert rec.default.misses_gen == 12 and rec.default.bytes_gen == 12000 and rec.bound.bytes_gen == 12000


def test_the_command_replays_a_trace_without_a_model(tmp_path) -> None:
    split = tmp_path / "split.json"
    out = tmp_path / "plan.json"
    r = _cli("plan", "--routing", str(_known(tmp_path)), "--bandwidth", "1", "--all", "--longhaul-cache", "4000B",
             "--write-split", str(split), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "0 prompt and 6 generated tokens" in r.stdout and "count the reads alone" in r.stdout
    assert "vs Belady" in r.stdout and f"wrote {split}" in r.stdout
    doc = json.loads(out.read_text())
    assert [b["n_slots"] for b in doc["budgets"]] == [1, 2, 3, 4]
    assert doc["recommendation"]["configs"][0]["misses_gen"] == 12
    r = _cli("plan", "--routing", str(_known(tmp_path)))
    assert r.returncode == 2 and "needs --bandwidth" in r.stderr
    r = _cli("plan", "--routing", str(tmp_path / "none.trace"), "--bandwidth", "1")
    assert r.returncode == 2 and "not found" in r.stderr


def test_our_recording_written_out_replays_alike(make_model, tmp_path) -> None:
    path = make_model(**dataclasses.asdict(SPEC))[0]
    info = inspect_model(path)
    prompt = np.random.default_rng(0).integers(3, 250, 40, dtype=np.int32)
    run = record_run(path, prompt, 6, budget=info.budget_for(8), n_threads=2, n_ubatch=16, timed=1)
    trace = tmp_path / "own.trace"
    save_routing(run, info, trace)
    for given in (info, None):  # the model's header, or the trace's own
        back, binfo = load_routing(trace, given, budget=run.budget)
        assert binfo.expert_bytes == info.expert_bytes and back.n_ubatch == run.n_ubatch_eff
        assert (back.n_prompt, back.n_gen, back.calls, back.outputs) == (run.n_prompt, run.n_gen, run.calls,
                                                                         run.outputs)
        for il, ids in run.routing.layers.items():
            assert np.array_equal(back.routing.layers[il], ids), il
        a, b = predict(run, info, 1e6), predict(back, binfo, 1e6)
        assert [(r.hit_lru_gen, r.hit_lru_prompt, r.mib_per_token_gen) for r in a] == \
            [(r.hit_lru_gen, r.hit_lru_prompt, r.mib_per_token_gen) for r in b]
    # the command: --save-routing, then --routing with the model supplying the sizes
    saved = tmp_path / "cli.trace"
    r = _cli("plan", str(path), "-p", "24", "-n", "4", "-ub", "16", "--bandwidth", "100", "--save-routing", str(saved),
             "--json", str(tmp_path / "a.json"))
    assert r.returncode == 0 and f"wrote the routing to {saved}" in r.stdout, r.stderr
    r = _cli("plan", "-m", str(path), "--routing", str(saved), "--bandwidth", "100", "--json", str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr
    a, b = (json.loads((tmp_path / f"{n}.json").read_text())["recommendation"]["configs"] for n in "ab")
    assert [(c["policy"], c["split"], c["bytes_gen"], c["bytes_prompt"]) for c in a] == \
        [(c["policy"], c["split"], c["bytes_gen"], c["bytes_prompt"]) for c in b]


@pytest.mark.parametrize("body, message", [
    ("n_expert 4\n", "starts with 'longhaul-routing 1'"),
    (HEAD, "no token lines"),
    (HEAD + "g 0 0 0 4\ng 0 1 0 1\n", "expert id 4 is out of range"),
    (HEAD + "g 0 0 0\n", "1 expert ids; the model selects 2"),
    (HEAD + "g 0 0 1 1\n", "selected twice"),
    (HEAD + "g 0 0 0 1\ng 0 0 2 3\n", "layer 0 at position 0 appears twice"),
    (HEAD + "g 0 0 0 1\ng 1 0 0 1\ng 1 1 0 1\n", "layer 1 has no ids for position 0"),
    (HEAD + "g 0 0 0 1\np 1 0 0 1\n", "prompt precedes generation"),
    (HEAD + "g 0 0 x 1\n", "'x' is not an integer"),
    (HEAD + "speed 3\n", "unknown line 'speed'"),
    ("longhaul-routing 1\nn_expert 4\ng 0 0 0 1\n", "no n_expert_used"),
    ("longhaul-routing 1\nn_expert 4\nn_expert_used 2\ng 0 0 0 1\n", "no expert_bytes for layer 0"),
])
def test_a_malformed_trace_is_refused_with_its_line(tmp_path, body: str, message: str) -> None:
    path = tmp_path / "bad.trace"
    path.write_text(body)
    with pytest.raises(TraceError, match=message):
        load_routing(path)


def test_a_trace_of_another_model_is_refused(make_model, tmp_path) -> None:
    path = make_model(**dataclasses.asdict(SPEC))[0]
    info = inspect_model(path)
    t = tmp_path / "other.trace"
    t.write_text(HEAD + "g 0 0 0 1\n")
    with pytest.raises(TraceError, match="n_expert is 4, the model's 32"):
        load_routing(t, info)
    t.write_text("longhaul-routing 1\n" + "".join(f"g 0 {il} 0 1 2 3\n" for il in sorted(info.expert_bytes)[:-1]))
    with pytest.raises(TraceError, match="no token lines for routed layer"):
        load_routing(t, info)
