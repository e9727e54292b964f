"""`longhaul_cache="auto"`: the largest budget whose whole load fits in the memory available (one home in Python).

The library measures (`llama_longhaul_measure`: a dry run of the model at a budget and of a context, nothing
allocated or read); the policy is the caller's, as upstream's `-fit` lives in common: this module is the Python
twin of `common_longhaul_fit` (common/longhaul.cpp), the same headroom and the same search, so that a script and
the tools choose the same budget (tests/test_longhaul_auto.py compares them).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._lib import LlamaError, ffi, lib, log_mark, quiet_log, raise_error
from .longhaul import MIB, is_auto_budget, parse_cache_size, size_text
from .params import LoadMode, set_fields
from .params import context_params as context_params_struct

HEADROOM_DIV = 20            # COMMON_LONGHAUL_HEADROOM_DIV: 1/20 of the memory available stays free ...
HEADROOM_MIN = 64 * MIB      # COMMON_LONGHAUL_HEADROOM_MIN: ... at least 64 MiB
_EVERY_EXPERT = 2**63 - 1    # a budget above every expert (UINT64_MAX / 2, as common measures it)


@dataclasses.dataclass(frozen=True)
class CacheFit:
    """The budget `longhaul_cache="auto"` chose, and what the rest of the memory holds (the library's measurement
    at that budget). Bytes: budget <= available - resident - context - compute - io - headroom, at most
    max_budget."""

    budget: int
    available: int   # memory the slots go to may still give (the process's, or a GPU device's free memory)
    resident: int    # model weights outside the expert cache
    context: int     # KV cache and recurrent state at the context parameters
    compute: int     # compute buffers
    io: int          # read and staging buffers (outside the budget)
    headroom: int    # 5 % of available, at least 64 MiB
    cache: int       # bytes of the slots the budget buys
    min_budget: int  # one slot per routed MoE layer
    max_budget: int  # every expert cached
    n_slots: int     # fewest slots of any routed layer
    n_expert: int    # most experts of any routed layer
    source: str = ""  # where `available` comes from

    @property
    def others(self) -> int:
        return self.resident + self.context + self.compute + self.io + self.headroom


def _measure(path: Path, mparams: Any, cparams: Any, budget: int) -> CacheFit:
    m = ffi.new("struct llama_longhaul_measurement *")
    mparams.longhaul_cache_bytes = budget
    mark = log_mark()
    with quiet_log():
        ok = lib().llama_longhaul_measure(os.fsencode(path), mparams, cparams, m)
    if not ok:
        at = "with every expert cached" if budget == _EVERY_EXPERT else f"at a budget of {size_text(budget)}"
        raise_error(f"longhaul_cache='auto': the dry run of {path} {at} failed", mark)
    avail = int(m.available)
    return CacheFit(budget=budget, available=avail, resident=m.resident, context=m.context, compute=m.compute,
                    io=m.io, headroom=max(HEADROOM_MIN, avail // HEADROOM_DIV), cache=m.cache,
                    min_budget=m.min_budget, max_budget=m.max_budget, n_slots=m.n_slots, n_expert=m.n_expert,
                    source=ffi.string(m.source).decode("utf-8", "replace"))


def _refuse(path: Path, f: CacheFit) -> LlamaError:
    need = f.others + f.min_budget
    return LlamaError(
        f"no longhaul cache budget fits for {path}: not even one expert slot per routed MoE layer fits: "
        f"{size_text(f.available)} available ({f.source}) - resident weights {size_text(f.resident)} - KV cache "
        f"{size_text(f.context)} - compute buffers {size_text(f.compute)} - read buffers {size_text(f.io)} - headroom "
        f"{size_text(f.headroom)} leaves {size_text(max(0, f.available - f.others))}, and the smallest budget is "
        f"{size_text(f.min_budget)}: {size_text(need - min(f.available, need))} short. Free memory or raise the "
        f"memory limit, lower n_ctx or n_ubatch, or use a smaller quantization")


def fit_budget(path: Path, mparams: Any, cparams: Any) -> CacheFit:
    """common_longhaul_fit: measure with every expert cached (which also gives the memory available, used for every
    decision after it), take the largest budget the rest leaves, shrink it by any excess the dry run at it shows
    (buffers change with the slots), and if that does not settle, the most whole slots per layer that fit (halving
    between one slot per layer and the smallest budget measured not to fit)."""
    first = _measure(path, mparams, cparams, _EVERY_EXPERT)
    if first.available == 2**64 - 1:
        raise LlamaError("the memory available is unknown on this system, so longhaul_cache='auto' cannot choose a "
                         "budget: give a size instead, e.g. longhaul_cache=2 (GiB)")
    avail = first.available

    def at(budget: int) -> CacheFit:  # a measurement, against the first one's memory available
        f = _measure(path, mparams, cparams, budget)
        return dataclasses.replace(f, available=avail, headroom=first.headroom, source=first.source)

    def need(x: CacheFit) -> int:
        return x.others + x.cache

    f = first
    if f.others + f.min_budget > avail:
        raise _refuse(path, f)
    budget = min(avail - f.others, f.max_budget)
    hi = budget  # the smallest budget measured not to fit
    fits = False
    for _ in range(4):
        f = at(budget)
        if need(f) <= avail:
            fits = True
            break
        hi = budget
        if budget < f.min_budget + (need(f) - avail):
            break
        budget -= need(f) - avail
    if not fits:
        # the most whole slots per layer (n x the smallest budget) that fit, halving between one and `hi`
        unit = f.min_budget
        f = at(unit)
        if need(f) > avail:
            raise _refuse(path, f)
        n_lo, n_hi = 1, -(-hi // unit)  # n_hi x unit >= hi: does not fit
        while n_hi - n_lo > 1:
            mid = (n_lo + n_hi) // 2
            if need(at(mid * unit)) <= avail:
                n_lo = mid
            else:
                n_hi = mid
        budget = n_lo * unit
        f = at(budget)
    return dataclasses.replace(f, budget=budget)


def fit_longhaul_cache(path: str | os.PathLike[str], *, n_gpu_layers: int = 0,
                       context_params: Mapping[str, Any] | None = None, **params: Any) -> CacheFit:
    """The budget `longhaul_cache="auto"` would choose for this model, and the breakdown of the memory
    available (dry runs, nothing allocated). `context_params` are the context's (Model.context()'s
    defaults when None); other keyword arguments are `llama_model_params` fields. Raises LlamaError
    naming the shortfall when not even one expert slot per routed layer fits."""
    p = lib().llama_model_default_params()
    set_fields(p, "struct llama_model_params", {"load_mode": LoadMode.LONGHAUL, "n_gpu_layers": n_gpu_layers, **params})
    if not Path(path).is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    return fit_budget(Path(path), p, context_params_struct(**(context_params or {})))


def budget_bytes(value: str | int, path: str | os.PathLike[str], *, n_gpu_layers: int = 0,
                 context_params: Mapping[str, Any] | None = None) -> int:
    """A budget given as a caller gives `longhaul_cache` (bytes, GiB as a number, a size such as "512MiB", or
    "auto") in bytes: "auto" is the budget `fit_longhaul_cache` chooses for this model and context; the other
    forms follow `parse_cache_size`. For the tools that take a budget and load the model themselves (the
    planner's run, the demo)."""
    if is_auto_budget(value):
        return fit_longhaul_cache(path, n_gpu_layers=n_gpu_layers, context_params=context_params).budget
    return value if isinstance(value, int) and not isinstance(value, bool) else parse_cache_size(value)
