"""The bench's reports: results.json, results.md and results.png."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..longhaul import MIB
from ..modelinfo import inspect_model
from .analysis import analyse
from .results import Run


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(res: dict[str, Any]) -> str:
    m = res["model"]
    c = res["config"]
    lines = [f"Model `{Path(m['path']).name}`: {m['file_gib']:.2f} GiB, {m['n_expert']} experts (top-"
             f"{m['n_expert_used']}), {m['routed_gib']:.2f} GiB routed experts; {res['machine']['cores']} cores, "
             f"{c['threads']} threads; {res['machine']['date']}.", ""]
    if "read_bandwidth" in res:
        bw = res["read_bandwidth"]
        how = "O_DIRECT" if bw.get("direct") else "buffered"
        detail = (f"cold {bw['cold_bytes_per_s'] / MIB:.0f} MiB/s, read again {bw['reread_bytes_per_s'] / MIB:.0f} "
                  f"MiB/s; the bound uses the faster" if "cold_bytes_per_s" in bw else
                  f"{bw['bytes_per_s'] / MIB:.0f} MiB/s")
        lines.append(f"Random {how} reads of {bw['slice_bytes'] / 1024:.0f} KiB expert slices, "
                     f"{int(bw['threads'])} at a time: {detail}.")
        lines.append("")
    if "sweep_direct_io" in res:
        how = {"on": "with O_DIRECT (--longhaul-direct-io on): from the storage, as for a model that does not fit "
                     "in memory.",
               "off": "through the page cache (--longhaul-direct-io off).",
               "auto": "as the library chose (--longhaul-direct-io auto)."}[res["sweep_direct_io"]]
        lines += ["The sweep's runs (and the planner's recorded run) read experts " + how, ""]
    lines += ["| scenario | load | routing | state | test | t/s | hit rate | expert MiB/token | major faults/token "
              "| peak RSS GiB |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for run in res["runs"]:
        r = dataclasses.asdict(run)
        state = ("cold" if r["cold"] else ("steady" if r["scenario"] in ("cap", "sweep") else "warm")) \
            + (f", cap {r['cap_gib']:.2f} GiB" if r["cap_gib"] else "")
        tps = _fmt(r["tokens_per_s"], ".2f") if r["status"] == "ok" else r["status"]
        per_tok = None
        if r["expert_gib_read"] is not None and r["test_s"] and r["tokens_per_s"]:
            per_tok = r["expert_gib_read"] * 1024 / max(1.0, r["test_s"] * r["tokens_per_s"])
        lines.append(f"| {r['scenario']} | {r['label']} | {r['routing']} | {state} | {r['test']} | {tps} | "
                     f"{_fmt(None if r['hit_rate'] is None else 100 * r['hit_rate'], '.0f')}"
                     f"{'' if r['hit_rate'] is None else ' %'} | {_fmt(per_tok, '.1f')} | "
                     f"{_fmt(r.get('major_faults_per_token'), '.1f')} | {_fmt(r['peak_rss_gib'], '.2f')} |")
    lines += ["", "| target | goal | measured | met |", "|---|---:|---:|---|"]
    for t in res["analysis"]["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
        detail = f" ({t['detail']})" if t["detail"] else ""
        lines.append(f"| {t['target']}{detail} | {t['goal']:g} | {_fmt(t['measured'], '.2f')} | {met} |")
    ttft = res["analysis"].get("ttft_cold", [])
    if ttft:
        lines += ["", "Time to first token from a cold start (process start, load, the whole prompt; page cache "
                  "dropped):", "", "| load | prompt tokens | seconds |", "|---|---:|---:|"]
        for t in ttft:
            lines.append(f"| {t['scenario']}: {t['label']} | {t['n_prompt']} | {t['seconds']:.1f} |")
    for key, what, hidden, digits in (
            ("prompt_time", "prompt time goes (ms per prompt token", "the previous expert wave's matmuls, where the "
             "waves are pipelined", ".2f"),
            ("generation_time", "generation time goes (ms per token", "the cached experts' matmuls", ".1f")):
        rows = res["analysis"].get(key, [])
        if not rows:
            continue
        lines += ["", f"Where {what}; compute = every expert cached; reads hidden = read time that overlapped "
                  f"{hidden}; reads = expert bytes / probed read bandwidth; bound = max(reads, compute), sum = reads "
                  "+ compute, both in t/s):", "",
                  "| run | routing | t/s | I/O wait | (converting) | reads hidden | compute | reads | other "
                  "| bound | of bound | sum | of sum |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b in rows:
            ms = lambda k: _fmt(None if k not in b else 1000 * b[k], digits)  # noqa: E731
            lines.append(f"| {b['scenario']}: {b['label']} | {b['routing']} | {b['tokens_per_s']:.2f} | "
                         f"{ms('io_wait_s_per_token')} | {ms('convert_s_per_token')} | "
                         f"{ms('hidden_read_s_per_token')} | {ms('compute_s_per_token')} | {ms('read_s_per_token')} | "
                         f"{ms('other_s_per_token')} | {_fmt(b.get('bound_tokens_per_s'), '.2f')} | "
                         f"{_fmt(b.get('of_bound'), '.2f')} | {_fmt(b.get('sum_tokens_per_s'), '.2f')} | "
                         f"{_fmt(b.get('of_sum'), '.2f')} |")
    prefetched = [b for b in res["analysis"].get("generation_time", []) if b.get("prefetch_recall")]
    if prefetched:
        lines += ["", "The cross-layer prefetch in generation (recall: the share of the expert bytes the layers would "
                  "have read at their synchronizations that it had read ahead; wasted: what it read that the next "
                  "layer did not select):", "",
                  "| run | routing | t/s | MiB read / token | prefetch recall | wasted MiB / token |",
                  "|---|---|---:|---:|---:|---:|"]
        for b in prefetched:
            lines.append(f"| {b['scenario']}: {b['label']} | {b['routing']} | {b['tokens_per_s']:.2f} | "
                         f"{b['expert_mib_read_per_token']:.2f} | {100 * b['prefetch_recall']:.0f} % | "
                         f"{b['prefetch_wasted_mib_per_token']:.2f} |")
    planned = [(b, kind) for kind, key in (("prompt", "prompt_time"), ("generation", "generation_time"))
               for b in res["analysis"].get(key, []) if "predicted_tokens_per_s" in b]
    if planned:
        lines += ["", "The planner (`longhaul-cpp plan`: one run recorded at n_expert_used slots per layer, replayed at "
                  "each budget; docs/planner.md) against the sweep:", "",
                  "| run | routing | test | measured t/s | predicted t/s | error |", "|---|---|---|---:|---:|---:|"]
        for b, kind in planned:
            lines.append(f"| {b['label']} | {b['routing']} | {kind} | {b['tokens_per_s']:.2f} | "
                         f"{b['predicted_tokens_per_s']:.2f} | {100 * b['predicted_error']:+.0f} % |")
    if res.get("policies"):
        from .policies import markdown as policies_markdown
        lines += ["", policies_markdown(res["policies"]).rstrip("\n")]
    if res.get("trade"):
        from .trade import markdown as trade_markdown
        lines += ["", trade_markdown(res["trade"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> bool:
    """tokens/s against the budget, one line per routing and test, the overlapped bound dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = [dataclasses.asdict(r) for r in res["runs"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, test in zip(axes, ("pp", "tg")):
        for routing in res["config"]["routings"]:
            pts = sorted((r["fraction"], r["tokens_per_s"]) for r in runs if r["scenario"] == "sweep"
                         and r["routing"] == routing and r["test"].startswith(test) and r["status"] == "ok")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"longhaul, {routing}")
            if test == "tg":
                bound = sorted((b["fraction"], b["bound_tokens_per_s"]) for b in res["analysis"]["generation_time"]
                               if b["scenario"] == "sweep" and b["routing"] == routing and "bound_tokens_per_s" in b)
                if bound:
                    ax.plot([p[0] for p in bound], [p[1] for p in bound], "--", label=f"overlapped bound, {routing}")
        for r in runs:
            if r["status"] != "ok" or not r["test"].startswith(test) or r["scenario"] not in ("resident", "cap"):
                continue
            if r["scenario"] == "cap" and (r["cold"] or (r["load"] == "normal" and r["layout"] == "repacked")):
                continue
            ax.axhline(r["tokens_per_s"], lw=0.8, ls=":", color="gray")
            ax.annotate(r["label"], (1.0, r["tokens_per_s"]), fontsize=7, ha="right", va="bottom", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache budget (fraction of the routed experts)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{'prompt' if test == 'pp' else 'generation'} ({res['config']['n_prompt' if test == 'pp' else 'n_gen']}"
                     " tokens)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no sweep (e.g. only the cap scenario): nothing to label
            ax.legend(fontsize=7)
    fig.suptitle(f"longhaul-cpp bench: {Path(res['model']['path']).name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_reports(res: dict[str, Any], out: Path) -> list[Path]:
    """results.json, results.md and (with matplotlib) results.png of a run_bench() result."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "results.md"]
    files[0].write_text(json.dumps(dict(res, runs=[dataclasses.asdict(r) for r in res["runs"]]), indent=1))
    files[1].write_text(markdown(res))
    if plot(res, out / "results.png"):
        files.append(out / "results.png")
    return files


def rewrite_reports(out: Path) -> list[Path]:
    """Re-derive the analysis and the reports of an earlier run from its results.json (no measurement)."""
    data = json.loads((out / "results.json").read_text())
    runs = [Run.from_dict(r) for r in data["runs"]]
    info = inspect_model(Path(data["model"]["path"]))
    data["analysis"] = analyse(runs, info, data.get("read_bandwidth"), data["model"].get("io_bytes", 0))
    data["runs"] = runs
    return write_reports(data, out)
