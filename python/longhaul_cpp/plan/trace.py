"""Routing traces in text: the planner's input from another engine, another machine, or a published replay
(`longhaul-cpp plan --routing FILE`), and our own recordings written out (`--save-routing FILE`).
The format is docs/routing-trace.md:

    longhaul-routing 1
    n_expert 128
    n_expert_used 8
    expert_bytes 0 1769472          one line per routed layer (or `expert_bytes * BYTES`: every layer alike)
    p 0 0 17 3 99 ...               phase (p: prompt, g: generated), position, layer, the selected expert ids
    g 12 5 4 41 ...

Lines may come in any order and `#` starts a comment. Each layer's tokens are taken in position order; the
prompt's positions precede the generated ones. The model's header (`-m MODEL`) can stand in for the counts and
expert sizes; a trace carries no times, so its predictions count reads only unless a run supplies them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ..modelinfo import ModelInfo
from ..routing import Routing
from .record import PhaseRun, RecordedRun

MAGIC = "longhaul-routing"
VERSION = 1
N_BATCH = 2048  # the prompt's decode calls (as record_run's): what the trace's prompt is cut into


class TraceError(ValueError):
    """A trace that cannot be replayed: the message names the line and what is wrong."""


def save_routing(run: RecordedRun, info: ModelInfo, path: str | Path) -> None:
    """Write `run`'s routing (prompt then generated tokens, every routed layer) in the trace format, with the
    model's counts and expert sizes in the header."""
    n_tok = run.n_prompt + run.n_gen
    out_pos = ([run.n_prompt - 1] if run.n_prompt else []) + list(range(run.n_prompt, n_tok))
    lines = [f"{MAGIC} {VERSION}", f"# written by longhaul-cpp plan --save-routing from {info.path.name}",
             f"arch {info.arch}", f"n_expert {info.n_expert}", f"n_expert_used {info.n_expert_used}",
             f"n_ubatch {run.n_ubatch_eff or run.n_ubatch}", f"expert_bias {int(info.expert_bias)}"]
    lines += [f"expert_bytes {il} {b}" for il, b in sorted(info.expert_bytes.items())]
    # each layer's rows by position: every token, or (the last layer) the outputs only
    rows = {il: dict(zip(range(n_tok) if len(ids) == n_tok else out_pos, ids)) for il, ids in run.routing.layers.items()}
    for pos in range(n_tok):
        phase = "p" if pos < run.n_prompt else "g"
        for il, by_pos in rows.items():
            if pos in by_pos:
                lines.append(f"{phase} {pos} {il} " + " ".join(str(int(e)) for e in by_pos[pos]))
    Path(path).write_text("\n".join(lines) + "\n")


_INT = re.compile(r"^-?\d+$")


def _ints(words: Iterable[str], where: str) -> list[int]:
    out = []
    for w in words:
        if not _INT.match(w):
            raise TraceError(f"{where}: '{w}' is not an integer")
        out.append(int(w))
    return out


def load_routing(path: str | Path, info: ModelInfo | None = None, *, n_ubatch: int | None = None,
                 budget: int | None = None) -> tuple[RecordedRun, ModelInfo]:
    """Parse a trace into a run the planner replays (no times: its phases took 0 s) and the model facts it needs:
    `info` (a model's header, `-m`) when given, else the trace's header. n_ubatch: the ubatch to replay at
    (default: the trace's, else 512); budget: the run's budget (default: n_expert_used slots per layer)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"routing trace not found: {path}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a routing trace (not UTF-8 text; the format is docs/routing-trace.md)") from None
    head: dict[str, str] = {}
    expert_bytes: dict[int, int] = {}
    every_layer: int | None = None
    rows: list[tuple[str, int, int, list[int], int]] = []  # phase, position, layer, ids, line number
    seen_magic = False
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{n}"
        key = words[0]
        if not seen_magic:
            if key != MAGIC or len(words) != 2 or words[1] != str(VERSION):
                raise TraceError(f"{where}: a routing trace starts with '{MAGIC} {VERSION}' (docs/routing-trace.md)")
            seen_magic = True
        elif key in ("p", "g"):
            if len(words) < 4:
                raise TraceError(f"{where}: a token line is 'p|g POSITION LAYER ID ...': it has no expert ids")
            pos, il, *ids = _ints(words[1:], where)
            if pos < 0 or il < 0:
                raise TraceError(f"{where}: position and layer must not be negative")
            rows.append((key, pos, il, ids, n))
        elif key == "expert_bytes":
            if len(words) != 3:
                raise TraceError(f"{where}: 'expert_bytes LAYER BYTES' (or 'expert_bytes * BYTES')")
            size = _ints(words[2:], where)[0]
            if size <= 0:
                raise TraceError(f"{where}: an expert's bytes must be above 0")
            if words[1] == "*":
                every_layer = size
            else:
                expert_bytes[_ints(words[1:2], where)[0]] = size
        elif key in ("n_expert", "n_expert_used", "n_ubatch", "expert_bias", "arch"):
            if len(words) != 2:
                raise TraceError(f"{where}: '{key} VALUE'")
            head[key] = words[1]
        else:
            raise TraceError(f"{where}: unknown line '{key}' (header keys: n_expert, n_expert_used, expert_bytes, "
                             "n_ubatch, expert_bias, arch; token lines start with p or g)")
    if not seen_magic:
        raise TraceError(f"{path}: empty: a routing trace starts with '{MAGIC} {VERSION}'")
    if not rows:
        raise TraceError(f"{path}: no token lines ('p|g POSITION LAYER ID ...')")
    layers_seen = sorted({r[2] for r in rows})
    info = info if info is not None else _info_from_header(path, head, expert_bytes, every_layer, layers_seen)
    for key, have in (("n_expert", info.n_expert), ("n_expert_used", info.n_expert_used)):
        if key in head and int(head[key]) != have:
            raise TraceError(f"{path}: the trace's {key} is {head[key]}, the model's {have}: a trace of another model")
    routing, n_prompt, n_gen, calls, outputs = _routing(path, rows, info)
    if n_ubatch is None:
        n_ubatch = int(head["n_ubatch"]) if _INT.match(head.get("n_ubatch", "")) else 512
    if n_ubatch <= 0:
        raise TraceError(f"{path}: n_ubatch must be above 0")
    budget = budget if budget is not None else info.budget_for(max(1, info.n_expert_used))
    if budget < info.min_budget:
        raise ValueError(f"budget {budget} bytes is below the minimum of {info.min_budget} (one slot per layer)")
    zero = lambda n: PhaseRun(n_tokens=n, seconds=0.0, wait_s=0.0, read_s=0.0, bytes_read=0, n_misses=0)  # noqa: E731
    run = RecordedRun(routing=routing, calls=calls, outputs=outputs, n_prompt=n_prompt, n_gen=n_gen, budget=budget,
                      n_ubatch=n_ubatch, prompt=zero(n_prompt), gen=zero(n_gen), misses={}, hit_s=None, flags=0,
                      n_ubatch_eff=info.effective_ubatch(budget, n_ubatch))
    return run, info


def _info_from_header(path: Path, head: Mapping[str, str], expert_bytes: dict[int, int], every_layer: int | None,
                      layers: list[int]) -> ModelInfo:
    missing = [k for k in ("n_expert", "n_expert_used") if not _INT.match(head.get(k, ""))]
    if missing:
        raise TraceError(f"{path}: the header has no {missing[0]}: add it, or give the model (-m MODEL)")
    if every_layer is not None:
        expert_bytes = {il: expert_bytes.get(il, every_layer) for il in layers}
    absent = [il for il in layers if il not in expert_bytes]
    if absent:
        raise TraceError(f"{path}: no expert_bytes for layer {absent[0]}: add 'expert_bytes {absent[0]} BYTES' (or "
                         "'expert_bytes * BYTES'), or give the model (-m MODEL)")
    n_expert, n_used = int(head["n_expert"]), int(head["n_expert_used"])
    if n_expert <= 0 or not 0 < n_used <= n_expert:
        raise TraceError(f"{path}: n_expert {n_expert}, n_expert_used {n_used}: need 0 < n_expert_used <= n_expert")
    return ModelInfo(path=path, shards=[], arch=head.get("arch", "unknown"), n_layer=max(expert_bytes) + 1,
                     n_expert=n_expert, n_expert_used=n_used, expert_bytes=dict(sorted(expert_bytes.items())),
                     expert_types=[], file_bytes=0, expert_bias=head.get("expert_bias", "0") not in ("0", "false"))


def _routing(path: Path, rows: list[tuple[str, int, int, list[int], int]], info: ModelInfo
             ) -> tuple[Routing, int, int, list[int], list[int]]:
    """Per-layer token streams in position order, checked against the model, and the decode calls they ran in."""
    phase_of: dict[int, str] = {}
    by_layer: dict[int, dict[int, np.ndarray]] = {}
    for phase, pos, il, ids, n in rows:
        where = f"{path}:{n}"
        if il not in info.expert_bytes:
            raise TraceError(f"{where}: layer {il} is not a routed MoE layer of the model (those are "
                             f"{_span(sorted(info.expert_bytes))})")
        if len(ids) != info.n_expert_used:
            raise TraceError(f"{where}: {len(ids)} expert ids; the model selects {info.n_expert_used} per token")
        bad = [e for e in ids if not 0 <= e < info.n_expert]
        if bad:
            raise TraceError(f"{where}: expert id {bad[0]} is out of range (the model has {info.n_expert} experts)")
        if len(set(ids)) != len(ids):
            raise TraceError(f"{where}: an expert id is selected twice for one token")
        if phase_of.setdefault(pos, phase) != phase:
            raise TraceError(f"{where}: position {pos} is both a prompt and a generated token")
        if pos in by_layer.setdefault(il, {}):
            raise TraceError(f"{where}: layer {il} at position {pos} appears twice")
        by_layer[il][pos] = np.asarray(ids, dtype=np.int32)
    positions = sorted(phase_of)
    n_prompt = sum(1 for p in positions if phase_of[p] == "p")
    if any(phase_of[p] == "p" for p in positions[n_prompt:]):
        raise TraceError(f"{path}: a prompt position comes after a generated one: the prompt precedes generation")
    n_gen = len(positions) - n_prompt
    calls = [min(N_BATCH, n_prompt - i) for i in range(0, n_prompt, N_BATCH)] + [1] * n_gen
    outputs = [0] * (len(calls) - n_gen) + [1] * n_gen
    if n_prompt:
        outputs[len(calls) - n_gen - 1] = 1
    out_pos = set(([positions[n_prompt - 1]] if n_prompt else []) + positions[n_prompt:])
    absent = sorted(set(info.expert_bytes) - set(by_layer))
    if absent:
        raise TraceError(f"{path}: no token lines for routed layer {absent[0]} ({len(absent)} of the model's "
                         f"{len(info.expert_bytes)} routed layers absent): a trace covers every routed layer")
    layers: dict[int, np.ndarray] = {}
    for il, toks in sorted(by_layer.items()):
        have = set(toks)
        if have != set(positions) and have != out_pos:
            lack = sorted(set(positions) - have)
            raise TraceError(f"{path}: layer {il} has no ids for position {lack[0]} ({len(lack)} missing): every "
                             "routed layer needs every token (or, the last one, the tokens whose logits were wanted)")
        layers[il] = np.stack([toks[p] for p in sorted(toks)])
    routing = Routing(layers=layers, ubatches={il: [len(a)] for il, a in layers.items()})
    return routing, n_prompt, n_gen, calls, outputs


def _span(xs: list[int]) -> str:
    return f"{xs[0]}-{xs[-1]}" if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))


__all__ = ["TraceError", "load_routing", "save_routing"]
