"""Longhaul helpers: cache budget parsing, the cache statistics dataclasses, the library's test hooks (the
plain-experts reference load, an injected read failure)."""
from __future__ import annotations

import contextlib
import json
import dataclasses
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._lib import ffi, lib

@contextlib.contextmanager
def plain_expert_banks() -> Iterator[None]:
    """Models loaded inside keep their routed expert banks in the plain CPU layout, as longhaul's slots hold them,
    and every other weight in the optimized (repacked) buffer types as usual: a normal load then runs exactly
    longhaul's kernels, the exact reference for its output on any CPU (a test hook of the library,
    llama_longhaul_test_plain_experts; `-ot ffn_.*_exps=CPU` does not do this: an override to the CPU still
    repacks)."""
    lib().llama_longhaul_test_plain_experts(True)
    try:
        yield
    finally:
        lib().llama_longhaul_test_plain_experts(False)


@contextlib.contextmanager
def failing_read(n: int) -> Iterator[None]:
    """Longhaul loads inside fail their n-th expert read call once (a test hook of the library for the error
    paths, llama_longhaul_test_fail_read): the read is retried, a second failure fails the decode."""
    lib().llama_longhaul_test_fail_read(int(n))
    try:
        yield
    finally:
        lib().llama_longhaul_test_fail_read(0)


KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40  # the package's unit constants (one home)
_MAX_BYTES = 2**63  # the library takes the budget as a uint64_t; above 2^63 the tools' GiB overflow
_UNITS = {"": GIB, "b": 1, "k": 1e3, "kb": 1e3, "kib": KIB, "m": 1e6, "mb": 1e6, "mib": MIB,
          "g": 1e9, "gb": 1e9, "gib": GIB, "t": 1e12, "tb": 1e12, "tib": TIB}


def policy_hint(n_slots: int, n_expert: int) -> str:
    """Which replacement to try when a budget caches `n_slots` of each layer's `n_expert` routed experts, with what
    each read in the project's replays: the library's line (llama_longhaul_policy_hint), the one the tools log at
    `--longhaul-cache auto`."""
    n = int(lib().llama_longhaul_policy_hint(n_slots, n_expert, ffi.NULL, 0))
    buf = ffi.new("char[]", n + 1)
    lib().llama_longhaul_policy_hint(n_slots, n_expert, buf, n + 1)
    return ffi.string(buf).decode("utf-8", "replace")


def parse_cache_size(value: float | int | str) -> int:
    """Cache budget in bytes from GiB (a number) or a string with a unit ("2GiB", "512MiB", "1.5")."""
    if isinstance(value, bool):
        raise ValueError(f"longhaul_cache must be a size, got {value!r}")
    if isinstance(value, (int, float)):
        gib = float(value)
        if not 0 < gib < _MAX_BYTES / GIB:  # also NaN and infinity
            raise ValueError(f"longhaul_cache must be a size in GiB above 0 and below 2^33 (8 EiB), got {value!r}")
        return int(gib * GIB)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"longhaul_cache '{value}' is not a size: use GiB as a number, or e.g. '2GiB', '512MiB'")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if not 0 < n < _MAX_BYTES:
        raise ValueError(f"longhaul_cache must be above 0 and below 8 EiB (2^63 bytes), got '{value}'")
    return n


def is_auto_budget(value: object) -> bool:
    """`longhaul_cache="auto"` (any case): the budget is chosen at load (longhaul_cpp.fit)."""
    return isinstance(value, str) and value.strip().lower() == "auto"


def python_budget_advice(message: str) -> str:
    """The library's budget advice, worded for the command line (`use --longhaul-cache 3MiB or more`, `give a larger
    --longhaul-cache`), in the Python keyword's terms."""
    message = re.sub(r"use --longhaul-cache (\S+) or more", r"use longhaul_cache='\1' or more", message)
    return message.replace("give a larger --longhaul-cache", "give a larger longhaul_cache=")


def size_text(n_bytes: int) -> str:
    """A size for people: B, KiB, MiB or GiB with two decimals (the library's and the tools' rule)."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes} B"


def size_arg(n_bytes: int) -> str:
    """A size `--longhaul-cache` / `longhaul_cache=` accepts, readable (B, KiB, MiB or GiB with at most two decimals)
    and not below n_bytes: rounded up by less than 1 % of its unit, so a minimum budget stays one slot per layer."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n_bytes >= scale:
            return f"{math.ceil(n_bytes * 100 / scale) / 100:g}{unit}"
    return f"{n_bytes}B"


def gib_arg(n_bytes: int) -> str:
    """A budget in bytes as the GiB that `--longhaul-cache` takes: n / 2^30 is exact in binary and its
    repr parses back to the same double, so the library gets exactly n bytes."""
    return repr(n_bytes / GIB)


@dataclasses.dataclass(frozen=True)
class LayerStats:
    """Counters of one routed MoE layer's expert cache (or the totals, il = -1)."""

    il: int
    n_slots: int
    expert_bytes: int
    cache_bytes: int
    n_hits: int
    n_misses: int
    n_evictions: int
    bytes_read: int
    n_reads: int
    n_batches: int
    n_stages: int
    t_read_s: float
    t_wait_s: float
    n_retries: int  # slices read a second time: every slice of an expert whose read failed, once
    bytes_converted: int  # expert bytes converted into the CPU's repacked layout as they were written
    t_convert_s: float    # seconds the reading threads spent converting (part of t_read_s)
    t_hidden_s: float     # read seconds that ran while the graph computed cached experts (not waited on)
    bytes_prefetched: int       # expert bytes read ahead by the cross-layer prefetch (LonghaulFlag.PREFETCH)
    bytes_prefetch_used: int    # of those, experts the layer's next synchronization selected
    bytes_prefetch_wasted: int  # of those, experts it did not select
    n_cached: int               # slots holding an expert now (the occupancy: longhaul_stats_reset keeps it)

    @property
    def hit_rate(self) -> float:
        n = self.n_hits + self.n_misses
        return self.n_hits / n if n else 0.0

    @property
    def bytes_missed(self) -> int:
        """Expert bytes the synchronizations read themselves (bytes_read less what the prefetch read)."""
        return self.n_misses * self.expert_bytes

    @property
    def prefetch_recall(self) -> float:
        """Of the experts the synchronizations would have read without the prefetch, the share (in bytes) it had
        read ahead: used / (used + missed); 0 without prefetch."""
        return _recall(self.bytes_prefetch_used, self.bytes_missed)

    @classmethod
    def from_c(cls, s: Any) -> LayerStats:
        return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class LonghaulStats:
    """Totals and per-layer counters of the longhaul expert cache."""

    total: LayerStats
    layers: list[LayerStats]

    @property
    def hit_rate(self) -> float:
        return self.total.hit_rate

    @property
    def prefetch_recall(self) -> float:
        """LayerStats.prefetch_recall over every layer, each layer's misses weighted by its own expert size (the
        library's summary and llama-bench's longhaul_prefetch_recall count the same way)."""
        return _recall(sum(l.bytes_prefetch_used for l in self.layers), sum(l.bytes_missed for l in self.layers))

    def as_dict(self) -> dict[str, Any]:
        return {"total": dataclasses.asdict(self.total) | {"hit_rate": self.total.hit_rate,
                                                            "prefetch_recall": self.prefetch_recall},
                "layers": self.records()}

    def records(self) -> list[dict[str, Any]]:
        """One dict per layer (pandas.DataFrame(stats.records()) works)."""
        return [dataclasses.asdict(l) | {"hit_rate": l.hit_rate, "prefetch_recall": l.prefetch_recall}
                for l in self.layers]


def _recall(used: int, missed: int) -> float:
    return used / (used + missed) if used + missed else 0.0


def load_split(path: str | Path) -> list[int]:
    """The per-layer slots (one entry per layer) of a file `longhaul-cpp plan --write-split` wrote."""
    try:
        data = json.loads(Path(path).read_text())
        slots = data["layer_slots"]
        if not isinstance(slots, list):
            raise TypeError(f"\"layer_slots\" is a {type(slots).__name__}, not a list")
        for n in slots:  # whole numbers only: no bool, float or string (int() would take True, 3.7 and "3")
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 2**31 - 1:
                raise TypeError(f"\"layer_slots\" holds {n!r}, not a number of slots")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a split written by `longhaul-cpp plan --write-split` ({e}): it needs "
                         "\"layer_slots\", a list of expert slots per layer") from e
    if not slots:
        raise ValueError(f"{path}: the split lists no layer")
    return slots
