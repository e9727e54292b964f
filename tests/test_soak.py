"""`longhaul-cpp soak` (longhaul_cpp.soak): a short soak of llama-server in longhaul mode with injected read faults,
and its verdict's rules on made-up outcomes (a check that cannot fail would prove nothing)."""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from longhaul_cpp.models import SyntheticSpec
from longhaul_cpp.soak import SoakConfig
from longhaul_cpp.soak.clients import Outcome, prompt_pool, same_answer
from longhaul_cpp.soak.reference import NEAR_TIE, Reference
from longhaul_cpp.soak.report import evaluate

from conftest import run

SPEC = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q4_0")


def test_soak_of_a_server_with_read_faults(make_model, tmp_path) -> None:
    """60 s of 8 clients on --parallel 4 at half the experts, one read in 2000 failing: the server lives, faulted
    requests name the file and offset and the ones after them succeed, answers equal a normal load's, pollers answer,
    file descriptors stay put (the soak's own checks); and faults did happen."""
    path = make_model(**dataclasses.asdict(SPEC))[0]
    out = tmp_path / "soak.json"
    r = run([sys.executable, "-m", "longhaul_cpp", "soak", "-m", str(path), "--longhaul-cache",
             f"{SPEC.budget_for(SPEC.n_expert // 2)}B", "--seconds", "60", "--fail-every", "2000", "--max-prompt",
             "1024", "--json", str(out), "--server-log", str(tmp_path / "server.log")], timeout=900, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["passed"] and res["requests"] >= 40
    assert res["by_status"].get("fault", 0) > 0 and res["by_status"].get("ok", 0) > 0
    assert res["by_status"].get("cancelled", 0) > 0
    assert res["answers"]["equal"] > 0 and res["answers"]["differs"] == 0
    assert all("offset" in m for m in res["faults"])
    assert res["polls"] > 0 and len(res["samples"]) >= 10


def _ref() -> Reference:
    toks = [5, 6, 7, 8]
    return Reference(toks, [1.0, 0.5, NEAR_TIE / 10, 1.0], ["", "a", "ab", "abc", "abcd"])


def test_answers_are_judged_by_tokens_and_near_ties() -> None:
    ref = _ref()
    assert ref.judge([5, 6, 7, 8], "abcd") == "equal"
    assert ref.judge([5, 6, 9, 1], "abxy") == "near-tie"  # leaves at position 2, whose best two are a hair apart
    assert ref.judge([5, 9, 7, 8], "axcd") == "differs"   # position 1 is no near-tie
    assert ref.judge([5, 6, 7], "abc") == "differs"       # shorter, ending where no tie is
    assert ref.judge(None, "abcd") == "equal"             # a stream: its text
    assert ref.judge(None, "abzz") == "near-tie"
    assert ref.judge(None, "azzz") == "differs"
    # a stream holds back an unfinished UTF-8 character at its end
    assert same_answer("ab", "ab\ufffd") and not same_answer("ab", "abc") and not same_answer("abc", "ab")


def _outcome(i: int, status: str, start: float, **kw) -> Outcome:
    return Outcome(client=i, prompt=0, kind="plain", start=start, seconds=0.1, status=status, **kw)


def _eval(outcomes: list[Outcome], fail_every: int = 0, alive: bool = True) -> dict:
    cfg = SoakConfig(model=None, budget="1", seconds=100.0, fail_every=fail_every)  # type: ignore[arg-type]
    samples = [{"t": float(t), "rss": 100e6, "fds": 4} for t in range(0, 100, 10)]
    return evaluate(cfg, outcomes, samples, {}, 10, [_ref()], alive, None if alive else -11)


def _failed(res: dict) -> set[str]:
    return {c["check"] for c in res["checks"] if c["ok"] is False}


def test_the_verdict_fails_what_it_should() -> None:
    good = [_outcome(0, "ok", 1.0, content="abcd", tokens=[5, 6, 7, 8])]
    assert _eval(good)["passed"]
    assert not _eval(good, alive=False)["passed"]
    # an answer that is not the normal load's
    assert "every completed answer equals the normal load's" in _failed(
        _eval([_outcome(0, "ok", 1.0, content="xbcd", tokens=[9, 6, 7, 8])]))
    # an error that is not an injected fault
    assert _failed(_eval(good + [_outcome(1, "error", 2.0, message="HTTP 500: boom")]))
    # a fault without injection, a fault without its file and offset, a fault that sticks
    assert _failed(_eval(good + [_outcome(1, "fault", 2.0, message="read error in f at offset 3")]))
    assert _failed(_eval([_outcome(1, "fault", 0.5, message="read error"), *good], fail_every=10))
    stuck = [_outcome(1, "fault", 0.5, message="read error in f at offset 3"), _outcome(1, "error", 0.7), *good]
    assert _failed(_eval(stuck, fail_every=10))
    ok = [_outcome(1, "fault", 0.5, message="read error in f at offset 3"), *good]
    assert _eval(ok, fail_every=10)["passed"]
    # descriptors that leak
    res = evaluate(SoakConfig(model=None, budget="1", seconds=100.0), good,  # type: ignore[arg-type]
                   [{"t": float(t), "rss": 100e6, "fds": 4 + t // 10} for t in range(0, 100, 10)], {}, 10, [_ref()],
                   True, None)
    assert "file descriptors constant after the warmup" in _failed(res)


@pytest.mark.parametrize("n, longest", [(24, 2048), (5, 16)])
def test_prompt_pool_spans_one_word_to_the_longest(n: int, longest: int) -> None:
    pool = prompt_pool(n, longest)
    assert len(pool) == n and pool == prompt_pool(n, longest)
    assert len(pool[0]) <= 3 and longest * 0.9 <= len(pool[-1]) <= longest
