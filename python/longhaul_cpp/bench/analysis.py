"""The bench's targets as measured ratios, and where the time of each longhaul run goes."""
from __future__ import annotations

from typing import Any

from ..longhaul import GIB, MIB
from ..modelinfo import ModelInfo
from .results import Run


def find(runs: list[Run], scenario: str, kind: str, *, load: str, layout: str | None = None, routing: str | None = None,
         cold: bool | None = None) -> Run | None:
    """The first successful run of `scenario` and test kind ("pp" | "tg") with these fields."""
    for r in runs:
        if (r.scenario == scenario and r.kind == kind and r.load == load and r.ok
                and (layout is None or r.layout == layout) and (routing is None or r.routing == routing)
                and (cold is None or r.cold == cold)):
            return r
    return None


def ratio(a: Run | None, b: Run | None) -> float | None:
    if a is None or b is None or not a.tokens_per_s or not b.tokens_per_s:
        return None
    return a.tokens_per_s / b.tokens_per_s


def analyse(runs: list[Run], info: ModelInfo, bw: dict[str, float] | None, io_bytes: int = 0) -> dict[str, Any]:
    """The issue's targets as measured ratios, and where the time of each longhaul run goes."""
    a: dict[str, Any] = {"targets": []}
    targets = a["targets"]

    def target(name: str, value: float | None, goal: float, detail: str = "") -> None:
        targets.append({"target": name, "goal": goal, "measured": value,
                        "met": None if value is None else value >= goal, "detail": detail})

    # longhaul's slots take the default load's layout (repacked where the CPU repacks the banks)
    default_pp = find(runs, "resident", "pp", load="normal", layout="repacked")
    default_tg = find(runs, "resident", "tg", load="normal", layout="repacked")
    lh_pp = find(runs, "allcached", "pp", load="longhaul")
    lh_tg = find(runs, "allcached", "tg", load="longhaul")
    target("every expert cached: generation / resident (default load, same layout)", ratio(lh_tg, default_tg), 0.95)
    target("every expert cached: prompt / resident (default load, same layout)", ratio(lh_pp, default_pp), 0.95)
    for kind, cold in (("cold", True), ("steady", False)):
        target(f"under the cap, {kind}: longhaul generation / mmap generation",
               ratio(find(runs, "cap", "tg", load="longhaul", cold=cold), find(runs, "cap", "tg", load="mmap", cold=cold)),
               20.0)
        target(f"under the cap, {kind}: longhaul prompt / mmap prompt",
               ratio(find(runs, "cap", "pp", load="longhaul", cold=cold), find(runs, "cap", "pp", load="mmap", cold=cold)),
               1.0)

    # time per token: I/O wait (the library's counter), compute (the all-cached run of the same test),
    # the rest (synchronization, planning, wave overhead); for generation also the overlapped bound
    def time_split(test: str, compute: Run | None) -> list[dict[str, Any]]:
        compute_s = 1.0 / compute.tokens_per_s if compute and compute.tokens_per_s else None
        rows = []
        for r in runs:
            if r.load != "longhaul" or r.hit_rate is None or not r.ok or r.kind != test or not r.tokens_per_s:
                continue
            n_timed = r.n_tokens * max(1, round((r.test_s or 0) * r.tokens_per_s / max(r.n_tokens, 1)))
            per_tok = 1.0 / r.tokens_per_s
            wait = (r.io_wait_s or 0.0) / max(n_timed, 1)
            convert = (r.convert_s or 0.0) / max(n_timed, 1)
            hidden = (r.hidden_s or 0.0) / max(n_timed, 1)
            missed = (r.expert_gib_read or 0.0) * GIB / max(n_timed, 1)
            row: dict[str, Any] = {"scenario": r.scenario, "label": r.label, "load": r.load, "routing": r.routing,
                                   "cold": r.cold,
                                   "fraction": r.fraction, "tokens_per_s": r.tokens_per_s, "s_per_token": per_tok,
                                   "io_wait_s_per_token": wait, "convert_s_per_token": convert,
                                   "hidden_read_s_per_token": hidden,
                                   "expert_mib_read_per_token": missed / MIB,
                                   "hit_rate": r.hit_rate}
            if r.prefetch_wasted_gib is not None:
                row["prefetch_recall"] = r.prefetch_recall
                row["prefetch_wasted_mib_per_token"] = r.prefetch_wasted_gib * GIB / MIB / max(n_timed, 1)
            if r.predicted_tokens_per_s:
                row["predicted_tokens_per_s"] = r.predicted_tokens_per_s
                row["predicted_error"] = r.predicted_tokens_per_s / r.tokens_per_s - 1
            if compute_s is not None:
                row["compute_s_per_token"] = compute_s
                row["other_s_per_token"] = max(0.0, per_tok - wait - compute_s)
                if bw is not None:
                    # overlapped: reads and compute run at the same time at best; the sum: one after the other
                    read_s = missed / bw["bytes_per_s"]
                    row["read_s_per_token"] = read_s
                    row["bound_tokens_per_s"] = bound = 1.0 / max(read_s, compute_s)
                    row["of_bound"] = r.tokens_per_s / bound
                    row["sum_tokens_per_s"] = serial = 1.0 / (read_s + compute_s)
                    row["of_sum"] = r.tokens_per_s / serial
            rows.append(row)
        return rows

    a["generation_time"] = breakdown = time_split("tg", lh_tg)
    a["prompt_time"] = time_split("pp", lh_pp)

    # time to first token from a cold start: the wall time of a cold prompt-only process
    # (start, load, the whole prompt; the first token's logits are ready at its end)
    a["ttft_cold"] = [{"label": r.label, "load": r.load, "scenario": r.scenario, "n_prompt": r.n_tokens, "seconds": r.wall_s}
                      for r in runs if r.cold and r.ok and r.kind == "pp" and r.wall_s]
    sweep = [b for b in breakdown if b["scenario"] == "sweep" and "of_bound" in b]
    if sweep:
        worst = min(sweep, key=lambda b: b["of_bound"])
        # time per token within 1.2x of max(compute, reads at the probe's bandwidth)
        target("sweep: generation / overlapped bound (worst budget)", worst["of_bound"], round(1 / 1.2, 3),
               f"{worst['routing']} routing, {worst['fraction']:.4g} of the experts")

    # the planner (longhaul-cpp plan): its predicted t/s at each sweep budget against the measured
    planned = [b for b in breakdown + a["prompt_time"] if b["scenario"] == "sweep" and "predicted_error" in b]
    if planned:
        worst_p = max(planned, key=lambda b: abs(b["predicted_error"]))
        target("sweep: the planner's predicted / measured t/s - 1 (worst, either sign; goal <= 0.15)",
               abs(worst_p["predicted_error"]), 0.15,
               f"{worst_p['routing']} routing, {worst_p['fraction']:.4g} of the experts, "
               f"{'generation' if worst_p in breakdown else 'prompt'}: predicted {worst_p['predicted_tokens_per_s']:.2f}, "
               f"measured {worst_p['tokens_per_s']:.2f} t/s")
        targets[-1]["met"] = abs(worst_p["predicted_error"]) <= 0.15

    # peak RSS against resident weights + budget + KV and buffers (+5 %); KV and compute buffers are taken
    # from the normal plain load's peak over its weights (the same context), longhaul's read and staging
    # buffers (io_bytes, outside the budget by the spec) from the library (llama_longhaul_measure)
    resident = info.file_bytes - info.routed_bytes
    plain = [r for r in runs if r.scenario == "resident" and r.load == "normal" and r.layout == "plain" and r.ok]
    extra = max((r.peak_rss_gib * GIB - info.file_bytes for r in plain), default=0.0)
    rss = []
    for r in runs:
        if r.budget_bytes is None or not r.ok or r.peak_rss_gib is None or r.cap_gib is not None:
            continue
        budget = min(r.budget_bytes, info.routed_bytes)
        limit = (resident + budget + max(extra, 0.0) + (io_bytes if r.load == "longhaul" else 0)) * 1.05
        rss.append({"label": r.label, "routing": r.routing, "test": r.test, "peak_rss_gib": r.peak_rss_gib,
                    "limit_gib": limit / GIB, "ratio": r.peak_rss_gib * GIB / limit})
    a["peak_rss"] = rss
    if rss:
        worst_rss = max(rss, key=lambda x: x["ratio"])
        target("peak RSS / (resident + budget + KV and buffers + read buffers) * 1.05 (worst; goal <= 1)",
               worst_rss["ratio"], 1.0, f"{worst_rss['label']} {worst_rss['test']}")
        targets[-1]["met"] = worst_rss["ratio"] <= 1.0
    return a
