"""One measurement of `longhaul-cpp bench`, with the fields that identify it (never its display label)."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..longhaul import GIB

LOADS = ("normal", "mmap", "longhaul")  # llama-bench -lm none | mmap | longhaul
LAYOUTS = ("repacked", "plain")         # optimized CPU buffer types on (default) | --repack 0


@dataclasses.dataclass
class Run:
    """One llama-bench process: one scenario, one test (pp or tg)."""
    scenario: str
    label: str                 # for display only: analysis and reports join runs by the fields below
    load: str                  # LOADS
    layout: str                # LAYOUTS: the load's buffer types (longhaul's expert slots follow them)
    routing: str
    test: str                  # "pp512", "tg128", ...
    budget_bytes: int | None   # longhaul budget, None for a normal load
    fraction: float | None     # budget / routed expert bytes
    cap_gib: float | None
    cold: bool
    status: str
    tokens_per_s: float | None = None
    n_tokens: int = 0
    hit_rate: float | None = None
    expert_gib_read: float | None = None
    io_wait_s: float | None = None
    convert_s: float | None = None      # of the reads: converting experts into the repacked layout
    hidden_s: float | None = None       # read seconds that overlapped compute (two-pass decode)
    prefetch_recall: float | None = None      # share of the would-be misses the cross-layer prefetch read ahead
    prefetch_wasted_gib: float | None = None  # expert GiB it read that the next layer did not select
    test_s: float | None = None         # timed seconds of the test (all repetitions)
    peak_rss_gib: float | None = None
    cgroup_peak_gib: float | None = None
    disk_gib_read: float | None = None  # whole process, /proc/PID/io read_bytes
    wall_s: float | None = None
    major_faults_per_token: float | None = None  # the process's major faults / every token it ran (warmup too)
    predicted_tokens_per_s: float | None = None  # the planner's prediction for this budget (sweep)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def kind(self) -> str:
        return self.test[:2]  # "pp" | "tg"

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Run:
        """A run from results.json, including those written before the load/layout/budget_bytes fields
        (their labels started with the load and named the layout)."""
        row = dict(row)
        label = row.get("label", "")
        row.setdefault("load", next((x for x in LOADS if label.startswith(x)), "normal"))
        row.setdefault("layout", "plain" if "plain" in label else "repacked")
        if "budget_bytes" not in row:
            gib = row.get("budget_gib")
            row["budget_bytes"] = None if gib is None else int(round(gib * GIB))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})
