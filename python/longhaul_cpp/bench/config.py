"""What `longhaul-cpp bench` measures: its models, scenarios and configuration."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..models.spec import SyntheticSpec


# the benchmark models (qwen35moe layout, Q4_0 experts, Q8_0 other weights)
BENCH_MODELS: dict[str, SyntheticSpec] = {
    # 2.64 GiB: 24 layers x 128 experts x 864 KiB
    "medium": SyntheticSpec(arch="qwen35moe", n_layer=24, n_embd=1024, n_head=16, n_head_kv=4, n_expert=128,
                            n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, expert_type="q4_0", weight_type="q8_0",
                            seed=1),
    # 10.6 GiB: 32 layers x 128 experts x 2.53 MiB
    "large": SyntheticSpec(arch="qwen35moe", n_layer=32, n_embd=2048, n_head=16, n_head_kv=4, n_expert=128,
                           n_expert_used=8, n_ff_exp=768, n_ff_shexp=768, expert_type="q4_0", weight_type="q8_0",
                           seed=2),
}
ROUTINGS = ("uniform", "zipf")  # the default routings; routers.ROUTERS has "calibrated" too (--routing)
SCENARIOS = ("resident", "allcached", "cap", "sweep", "policies", "trade")
DEFAULT_SCENARIOS = ("resident", "allcached", "cap", "sweep")


class BenchError(RuntimeError):
    pass


@dataclasses.dataclass
class BenchConfig:
    model: str = "medium"            # "medium" | "large" | a GGUF path
    routings: tuple[str, ...] = ROUTINGS
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    fractions: tuple[float, ...] = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    cap_fraction: float = 0.5
    cap_gib: float | None = None     # an absolute cap instead of cap_fraction
    trade_caps: tuple[str, ...] = ("1/2", "1/4")  # the trade scenario's caps: fractions of the model file or sizes
    trade_configs: tuple[str, ...] | None = None   # the trade scenario's configurations (None: all of them)
    n_prompt: int = 512
    n_gen: int = 128
    n_gen_capped: int = 16           # generation tokens of the (slow) mmap load under the cap
    threads: int = 2
    reps: int = 2
    cold: bool = True
    capped_timeout: float = 900.0
    sweep_direct_io: str = "on"      # --longhaul-direct-io of the sweep (and the planner's recorded run): on|off|auto
    out: Path = Path("longhaul-bench")

    def cap_bytes(self, file_bytes: int) -> int:
        """The memory cap: --cap-gib, else --cap of the model file."""
        return int(self.cap_gib * 2**30) if self.cap_gib else int(self.cap_fraction * file_bytes)


def parse_fractions(text: str) -> tuple[float, ...]:
    """Sweep budgets as fractions of the routed experts: "1/16,0.5,1"."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.lower() == "auto":
            raise ValueError("--budgets takes fractions of the routed experts, not auto: the budget auto picks "
                             "depends on the memory free at each load, so the runs would not compare across "
                             "machines or with each other; the cap scenario sizes its budget under the cap. To "
                             "bench the budget auto picks here, see it with `longhaul-cpp info MODEL "
                             "--longhaul-cache auto` and give its fraction of the routed experts")
        out.append(parse_fraction(part, "--budgets", "of the routed experts, e.g. 1/16,1/4,1"))
    return tuple(out)


def fraction_value(text: str) -> float | None:
    """The value of a fraction ("1/4") or a number ("0.25"); None when `text` is neither (a size such as "6GiB");
    NaN for a zero denominator."""
    num, _, den = text.strip().partition("/")
    try:
        return float(num) / float(den) if den else float(num)
    except ZeroDivisionError:
        return float("nan")
    except ValueError:
        return None


def parse_fraction(text: str, option: str, of: str, value: float | None = None) -> float:
    """One fraction in (0, 1], "1/4" or "0.25" (`value`: its fraction_value when the caller read it already);
    `option` and `of` (what it is a fraction of, with an example) name it in the error."""
    v = fraction_value(text) if value is None else value
    if v is None or not 0 < v <= 1:
        raise ValueError(f"{option} '{text}': a fraction must be in (0, 1], {of}")
    return v
