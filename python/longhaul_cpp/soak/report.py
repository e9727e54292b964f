"""The soak's verdict: requests and errors by kind, latency percentiles, RSS and file descriptors over time, and the
checks run_soak's docstring lists (each with what it measured)."""
from __future__ import annotations

import statistics
from typing import Any

from ..longhaul import MIB
from .clients import KINDS, Outcome
from .reference import NEAR_TIE, Reference

RSS_LIMIT = 0.01          # growth per 10 minutes after the warmup, as a share of the RSS
RSS_MIN_WINDOW = 300.0    # seconds of samples after the warmup before the RSS check applies


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else 0.0


def evaluate(cfg: Any, outcomes: list[Outcome], samples: list[dict[str, float]], poll_errors: dict[str, int],
             n_polls: int, reference: list[Reference], alive: bool, exit_code: int | None) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail})

    by_status: dict[str, int] = {}
    for o in outcomes:
        by_status[o.status] = by_status.get(o.status, 0) + 1
    latency = {k: {"p50": _pct([o.seconds for o in outcomes if o.kind == k and o.status == "ok"], 0.5),
                   "p99": _pct([o.seconds for o in outcomes if o.kind == k and o.status == "ok"], 0.99),
                   "n": sum(1 for o in outcomes if o.kind == k)} for k in KINDS}
    check("the server ran to the end", alive, "alive" if alive else f"exited with {exit_code}")
    errors = [o for o in outcomes if o.status == "error"]
    check("no request failed but for an injected fault", not errors,
          f"{len(errors)} failed" + (f", first: {errors[0].message}" if errors else ""))
    faults = [o for o in outcomes if o.status == "fault"]
    if cfg.fail_every == 0:
        check("no fault without injection", not faults, f"{len(faults)} faults")
    else:
        # no fault sticks: after each, the client's next request succeeds or meets another injected fault
        ordered = sorted(outcomes, key=lambda o: o.start)
        stuck = 0
        for f in faults:
            nxt = next((o for o in ordered if o.client == f.client and o.start > f.start), None)
            if nxt is not None and nxt.status == "error":
                stuck += 1
        unnamed = [f for f in faults if "offset" not in f.message]
        recovered = sum(1 for o in outcomes if o.status == "ok" and any(f.start < o.start for f in faults))
        check("a faulted request names the read; the next ones succeed",
              not unnamed and not stuck and (not faults or recovered > 0),
              f"{len(faults)} faulted requests ({len(unnamed)} without the file and offset), {stuck} followed by "
              f"another error, {recovered} successes after a fault" +
              (f"; first: {faults[0].message[:200]}" if faults else ""))
    verdicts = {"equal": 0, "near-tie": 0, "differs": 0}
    wrong: list[Outcome] = []
    if reference:
        for o in outcomes:
            if o.status == "ok":
                v = reference[o.prompt].judge(o.tokens, o.content)
                verdicts[v] += 1
                if v == "differs":
                    wrong.append(o)
    if cfg.compare:
        n = sum(verdicts.values())
        check("every completed answer equals the normal load's", n > 0 and not wrong,
              f"{n} compared: {verdicts['equal']} equal, {verdicts['near-tie']} leave it at a near-tie (the two best "
              f"logits within {NEAR_TIE}), {verdicts['differs']} differ" +
              (f" (prompt {wrong[0].prompt}, {wrong[0].kind}: {wrong[0].content!r} vs "
               f"{reference[wrong[0].prompt].prefixes[-1]!r})" if wrong else ""))
    check("the /metrics, /props and /slots polls answered", n_polls > 0 and not poll_errors,
          f"{n_polls} polls, failed: {poll_errors or 'none'}")
    after = [s for s in samples if s["t"] >= cfg.warmup * cfg.seconds and s["rss"] > 0]
    rss_growth = None
    if len(after) >= 2:
        fds = {int(s["fds"]) for s in after}
        check("file descriptors constant after the warmup", len(fds) == 1, f"{sorted(fds)}")
        mean = statistics.fmean(s["rss"] for s in after)
        rss_growth = _slope([(s["t"], s["rss"]) for s in after]) * 600.0 / mean
        window = after[-1]["t"] - after[0]["t"]
        ok = rss_growth < RSS_LIMIT if window >= RSS_MIN_WINDOW else None
        check("RSS after the warmup grows < 1 % per 10 minutes", ok,
              f"{rss_growth:+.2%} per 10 min over {window:.0f} s" +
              ("" if ok is not None else f" (reported only: under {RSS_MIN_WINDOW:.0f} s of samples)"))
    else:
        check("file descriptors constant after the warmup", None, "too few samples")
    passed = all(c["ok"] is not False for c in checks)
    return {"passed": passed, "checks": checks, "requests": len(outcomes), "by_status": by_status,
            "latency_s": latency, "samples": samples, "rss_growth_per_10min": rss_growth,
            "rss_mib": [round(s["rss"] / MIB, 1) for s in samples], "polls": n_polls,
            "faults": [o.message for o in faults][:20] if cfg.fail_every else [],
            "answers": verdicts,
            "differ": [{"prompt": o.prompt, "kind": o.kind, "got": o.content, "tokens": o.tokens,
                        "want": reference[o.prompt].prefixes[-1], "want_tokens": reference[o.prompt].tokens}
                       for o in wrong][:20],
            "outcomes": [[round(o.start, 2), round(o.seconds, 2), o.client, o.kind, o.status] for o in outcomes]}


def text(res: dict[str, Any]) -> str:
    out = [f"requests: {res['requests']} ({', '.join(f'{k} {v}' for k, v in sorted(res['by_status'].items()))}), "
           f"polls {res['polls']}"]
    for k, v in res["latency_s"].items():
        if v["p50"] is not None:
            out.append(f"  {k:7} n={v['n']:5}  p50 {v['p50']:.2f} s  p99 {v['p99']:.2f} s")
    if res["samples"]:
        s0, s1 = res["samples"][0], res["samples"][-1]
        out.append(f"RSS {s0['rss'] / MIB:.0f} -> {s1['rss'] / MIB:.0f} MiB, file descriptors {s0['fds']:.0f} -> "
                   f"{s1['fds']:.0f} ({len(res['samples'])} samples)")
    for c in res["checks"]:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[c["ok"]]
        out.append(f"{mark} {c['check']}: {c['detail']}")
    out.append("soak: passed" if res["passed"] else "soak: FAILED")
    return "\n".join(out)
