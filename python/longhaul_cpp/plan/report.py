"""The planner's table, its JSON and its plot."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..longhaul import GIB, size_text
from .predict import BudgetRow


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def shown_rows(rows: Sequence[BudgetRow], n_expert_used: int, marks: Sequence[BudgetRow | None]) -> list[BudgetRow]:
    """The rows worth printing: one slot, k slots, each doubling, every expert, and the marked rows."""
    want = {1, n_expert_used}
    s = 2
    while s <= rows[-1].n_slots:
        want.add(s)
        s *= 2
    keep = {id(m) for m in marks if m is not None}
    return [r for i, r in enumerate(rows) if r.n_slots in want or i == len(rows) - 1 or id(r) in keep]


def table(rows: Sequence[BudgetRow], knee: BudgetRow | None) -> str:
    head = (f"{'budget':>10} {'slots':>5}  {'hit LRU':>7} {'hit opt':>7}  {'MiB/token':>9}  "
            f"{'prompt t/s':>10} {'gen t/s':>8} {'gen t/s opt':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{size_text(r.budget):>10} {r.n_slots:5d}  "
                     f"{_f(r.hit_lru_gen, '7.1%')} {_f(r.hit_opt_gen, '7.1%')}  "
                     f"{_f(r.mib_per_token_gen, '9.2f')}  {_f(r.prompt_tps, '10.1f')} {_f(r.gen_tps, '8.2f')} "
                     f"{_f(r.gen_tps_opt, '11.2f')}{'  <- knee' if r is knee else ''}")
    return "\n".join(lines)


def to_json(rows: Sequence[BudgetRow], knee: BudgetRow | None, extra: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps({**extra, "knee_budget": knee.budget if knee else None,
                                "budgets": [dataclasses.asdict(r) for r in rows]}, indent=1) + "\n")


def plot(rows: Sequence[BudgetRow], knee: BudgetRow | None, path: Path, title: str) -> bool:
    """Hit rates and predicted t/s against the budget; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = [r.budget / GIB for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for attr, label in (("hit_lru_gen", "generation, LRU (longhaul)"), ("hit_opt_gen", "generation, optimal (Belady)"),
                        ("hit_lru_prompt", "prompt, LRU")):
        ys = [getattr(r, attr) for r in rows]
        if any(v is not None for v in ys):
            a1.plot(x, [v * 100 if v is not None else None for v in ys], label=label)
    a1.set_xlabel("expert cache budget (GiB)")
    a1.set_ylabel("hit rate (%)")
    a1.legend()
    for attr, label in (("gen_tps", "generation (LRU)"), ("gen_tps_opt", "generation (optimal)"),
                        ("prompt_tps", "prompt (LRU)")):
        ys = [getattr(r, attr) for r in rows]
        if any(v is not None for v in ys):
            a2.plot(x, ys, label=label)
    if knee is not None:
        for ax in (a1, a2):
            ax.axvline(knee.budget / GIB, color="grey", linestyle=":", label=None)
        a2.annotate("knee", (knee.budget / GIB, knee.gen_tps or knee.prompt_tps or 0))
    a2.set_xlabel("expert cache budget (GiB)")
    a2.set_ylabel("predicted tokens/s")
    a2.set_yscale("log")
    a2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
