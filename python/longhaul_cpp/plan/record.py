"""The planner's run: a prompt and N generated tokens in longhaul mode with the routing recorded and timed."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..context import Context
from ..fit import budget_bytes
from ..longhaul import LayerStats
from ..model import LoadMode, Model
from ..params import LonghaulFlag
from ..routing import DEFAULT_MAX_IDS, Routing, RoutingRecorder


@dataclasses.dataclass
class PhaseRun:
    """One phase (the prompt, or the generated tokens) of a timed repetition, with the library's counters."""
    n_tokens: int
    seconds: float
    wait_s: float          # the graph waited at the synchronizations (reads and planning)
    read_s: float          # expert reads took (some of it hidden behind compute)
    bytes_read: int
    n_misses: int
    convert_s: float = 0.0  # converting what was read into the CPU's repacked layout: each conversion's wall time
    # summed over the reading threads (with their waits for a core), so it can exceed read_s

    @classmethod
    def between(cls, n_tokens: int, seconds: float, a: LayerStats, b: LayerStats) -> PhaseRun:
        return cls(n_tokens=n_tokens, seconds=seconds, wait_s=b.t_wait_s - a.t_wait_s, read_s=b.t_read_s - a.t_read_s,
                   bytes_read=b.bytes_read - a.bytes_read, n_misses=b.n_misses - a.n_misses,
                   convert_s=b.t_convert_s - a.t_convert_s)


@dataclasses.dataclass
class RecordedRun:
    routing: Routing
    calls: list[int]       # tokens of each llama_decode of one repetition (the prompt in n_batch chunks, then 1s)
    outputs: list[int]     # of those, the tokens whose logits were wanted (the last token of the prompt, each 1)
    n_prompt: int
    n_gen: int
    budget: int
    n_ubatch: int          # asked for
    prompt: PhaseRun
    gen: PhaseRun
    misses: dict[int, int]  # per routed layer, of the recorded repetition (to check the replay against)
    hit_s: float | None = None  # seconds per token of a decode whose experts are all cached (None: not measured)
    flags: int = 0  # the longhaul switches in effect during the run (Model.longhaul_flags: the library's choices)
    n_ubatch_eff: int = 0  # the ubatch the context ran (what the slots allow), at which the routing was recorded:
    # routings recorded at other ubatches run other kernel paths, and nearly tied experts can swap on some CPUs

    def layer_calls(self, il: int) -> list[int]:
        """The tokens layer il ran in each call: all of them, or for the last layer (which runs only the tokens
        whose logits are wanted) the outputs."""
        return self.calls if len(self.routing.layers[il]) == sum(self.calls) else self.outputs

    @property
    def read_rate(self) -> float:
        """Bytes per second of the expert reads of the timed phases (0 when they read nothing)."""
        t = self.prompt.read_s + self.gen.read_s
        return (self.prompt.bytes_read + self.gen.bytes_read) / t if t > 0 else 0.0


def random_prompt(path: str | Path, n_tokens: int, seed: int = 0) -> np.ndarray:
    """n_tokens random token ids of the model's vocabulary (as llama-bench's prompts)."""
    if n_tokens < 0:
        raise ValueError("the number of prompt tokens must not be negative")
    with Model(path, vocab_only=True) as m:
        n_vocab = m.n_vocab
    return np.random.default_rng(seed).integers(0, n_vocab, n_tokens, dtype=np.int32)


def faster(a: PhaseRun | None, b: PhaseRun) -> PhaseRun:
    """The faster of two timings of the same work: this machine's noise only ever slows a run down."""
    return b if a is None or b.seconds < a.seconds else a


def time_hits(ctx: Context, model: Model, state: bytes, token: int, n: int) -> float | None:
    """Seconds per token of decoding `token` from the context state `state` (Context.state_get: the KV cache and
    any recurrent state), n times after once untimed. The same input routes to the same experts, which the
    previous decode left in the slots, so every layer hits and nothing is read: compute and the synchronization
    alone. The state is restored before each decode, untimed. None when a timed decode missed (fewer slots than a
    token selects: it runs in stages and reads)."""
    ctx.state_set(state)
    ctx.decode([token])
    s0 = model.longhaul_stats().total
    seconds = 0.0
    for _ in range(n):
        ctx.state_set(state)
        t0 = time.perf_counter()
        ctx.decode([token])
        seconds += time.perf_counter() - t0
    return seconds / n if model.longhaul_stats().total.n_misses == s0.n_misses else None


def record_routing(path: str | Path, prompt: np.ndarray, tokens: Sequence[int], *, n_ubatch: int,
                   max_ids: int = DEFAULT_MAX_IDS, decoded: Callable[[int], None] | None = None,
                   **context_params: int) -> Routing:
    """The routing of decoding `prompt`, then `tokens` one at a time, through the eval callback of a normal load
    (RoutingRecorder: no library API; a longhaul load's routing is a normal load's, bit for bit), with the
    ubatch the longhaul context ran (n_ubatch: its effective one). decoded(n): after each decode call, with its
    tokens (the progress)."""
    with Model(path) as model:
        recorder = RoutingRecorder(model.meta("general.architecture") or "")
        with model.context(n_ubatch=n_ubatch, routing=recorder, **context_params) as ctx:
            recorder.start(max_ids)
            if len(prompt):
                ctx.decode(prompt)
                if decoded:
                    decoded(len(prompt))
            for tok in tokens:
                ctx.decode([int(tok)])
                if decoded:
                    decoded(1)
            recorder.stop()
    return recorder.routing()


def decode_calls(n_prompt: int, n_gen: int, n_batch: int) -> tuple[list[int], list[int]]:
    """The tokens of each llama_decode of a run (the prompt in n_batch chunks, then one per generated token) and of
    those the tokens whose logits are wanted (the prompt's last token, as Context.decode asks, and each generated
    one): RecordedRun's calls and outputs."""
    calls = [min(n_batch, n_prompt - i) for i in range(0, n_prompt, n_batch)] + [1] * n_gen
    outputs = [0] * (len(calls) - n_gen) + [1] * n_gen
    if n_prompt:
        outputs[len(calls) - n_gen - 1] = 1
    return calls, outputs


def routing_run(path: str | Path, prompt: Sequence[int] | np.ndarray, feed: Sequence[int], *, n_ubatch: int,
                n_threads: int, n_batch: int = 2048) -> RecordedRun:
    """The routing of `prompt`, then the `feed` tokens one at a time, on a normal load, as a run to replay with no
    timings or misses of its own (Belady's bytes of a token stream, say). n_ubatch: the longhaul context's
    effective ubatch, which the replay runs."""
    toks = np.ascontiguousarray(prompt, dtype=np.int32)
    routing = record_routing(path, toks, [int(t) for t in feed], n_ubatch=n_ubatch, n_ctx=len(toks) + len(feed) + 8,
                             n_batch=n_batch, n_threads=n_threads, n_threads_batch=n_threads)
    calls, outputs = decode_calls(len(toks), len(feed), n_batch)
    none = PhaseRun(0, 0.0, 0.0, 0.0, 0, 0)
    return RecordedRun(routing=routing, calls=calls, outputs=outputs, n_prompt=len(toks), n_gen=len(feed), budget=0,
                       n_ubatch=n_ubatch, prompt=none, gen=none, misses={}, flags=int(LonghaulFlag.NO_ONLINE_SPLIT),
                       n_ubatch_eff=n_ubatch)


def record_run(path: str | Path, prompt: Sequence[int] | np.ndarray, n_gen: int, *, budget: int | str, n_threads: int,
               n_batch: int = 2048, n_ubatch: int = 512, max_ids: int = DEFAULT_MAX_IDS,
               random_gen: bool = False, timed: int = 2, flags: int = 0, feed: Sequence[int] | None = None,
               routing: Routing | None = None,
               layer_slots: dict[int, int] | Sequence[int] | str | Path | None = None,
               progress: Callable[[int, int], None] | None = None) -> RecordedRun:
    """Decode `prompt` then `n_gen` greedy tokens (end-of-generation tokens included: the count is fixed) in
    longhaul mode at `budget`, once to warm up (as a steady-state server would be), then `timed` times, each phase
    keeping its faster repetition (the first timed one gives the misses to check the replay against); the routing
    of the same tokens is then recorded on a normal load (record_routing: all of them route alike). random_gen:
    feed random tokens instead of the greedy ones (llama-bench's tg workload; the same seed in every repetition). feed: the n_gen tokens to decode after the prompt instead (a token stream such as
    routers.topic_stream: the routing it drives, whatever the model would pick); routing: the routing of these very
    tokens, recorded before (another run of the same prompt and feed): not recorded again. flags: `LonghaulFlag`s
    of the load (without PREFETCH, the run does not prefetch, whatever the library would choose: the replay does not
    model it; the online split is off, as the replay of a fixed split checks the run's misses). budget: bytes, or any `longhaul_cache` value
    ("512MiB", "auto": chosen for this run's context; the run records the bytes). layer_slots: a per-layer split
    of the budget (longhaul_layer_slots: {layer: slots}, one entry per layer, or a --write-split file) instead of
    the even one. progress(done, total): tokens decoded of all the repetitions' and the routing recording's."""
    if not int(flags) & (LonghaulFlag.PREFETCH | LonghaulFlag.NO_PREFETCH):
        flags = int(flags) | LonghaulFlag.NO_PREFETCH  # the replay does not model the prefetch: it stays off
    # the replay runs the split it is given (plan.online models the online one): the recorded run keeps it too
    flags = int(flags) | LonghaulFlag.NO_ONLINE_SPLIT
    toks = np.ascontiguousarray(prompt, dtype=np.int32)
    if len(toks) == 0 and n_gen == 0:
        raise ValueError("the planner needs a prompt or generated tokens")
    if feed is not None and len(feed) < n_gen:
        raise ValueError(f"feed has {len(feed)} tokens for {n_gen} generated ones")
    n_ctx = len(toks) + n_gen + 8
    calls, outputs = decode_calls(len(toks), n_gen, n_batch)
    prompt_run: PhaseRun | None = None
    gen_run: PhaseRun | None = None
    hits: list[float | None] = []
    misses: dict[int, int] = {}
    fed: list[int] = []  # the tokens each repetition decodes after the prompt (all alike)
    cp = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_threads_batch=n_threads)
    budget = budget_bytes(budget, path, context_params={**cp, "n_ubatch": n_ubatch})
    per_rep = len(toks) + n_gen
    total, done = per_rep * (1 + max(1, timed) + (routing is None)), 0

    def decoded(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    split = {} if layer_slots is None else {"longhaul_layer_slots": layer_slots}
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget, longhaul_flags=flags, **split) as model, \
            model.context(n_ubatch=n_ubatch, **cp) as ctx:
        flags = int(model.longhaul_flags)
        eff_ubatch = ctx.n_ubatch  # what the slots allow: the recording load runs the same ubatches
        for rep in range(1 + max(1, timed)):
            ctx.reset()
            rng = np.random.default_rng(1)
            s0 = model.longhaul_stats()
            t0 = time.perf_counter()
            next_tok = int(toks[-1]) if len(toks) else 0
            fed_src = iter([int(t) for t in feed[:n_gen]] + [0]) if feed is not None else iter(())
            pick = ((lambda: next(fed_src)) if feed is not None else
                    (lambda: int(rng.integers(model.n_vocab))) if random_gen else (lambda: int(np.argmax(ctx.logits()))))
            if feed is not None and not len(toks):
                next_tok = pick()
            if len(toks):
                ctx.decode(toks)
                decoded(len(toks))
                next_tok = pick()
            t1 = time.perf_counter()
            s1 = model.longhaul_stats()
            t_state = 0.0
            state, last, fed = b"", 0, []
            for i in range(n_gen):
                if i == n_gen - 1:  # the hit timing below decodes the last token again from here (not timed)
                    ts = time.perf_counter()
                    state, last = ctx.state_get(), next_tok
                    t_state = time.perf_counter() - ts
                ctx.decode([next_tok])
                decoded(1)
                fed.append(next_tok)
                next_tok = pick()
            t2 = time.perf_counter() - t_state
            s2 = model.longhaul_stats()
            if rep == 1:  # the misses the replay must give (every repetition after the warm-up has the same)
                misses = {b.il: b.n_misses - a.n_misses for a, b in zip(s0.layers, s2.layers)}
            if rep == 0:
                continue
            # after the last repetition only, so that every repetition's counts are the replay's: re-touching the
            # experts the last decode used changes no slot's LRU order, but it adds uses under LFU
            if rep == max(1, timed):
                hits.append(time_hits(ctx, model, state, last, max(8, n_gen)) if n_gen else None)
            prompt_run = faster(prompt_run, PhaseRun.between(len(toks), t1 - t0, s0.total, s1.total))
            gen_run = faster(gen_run, PhaseRun.between(n_gen, t2 - t1, s1.total, s2.total))
    if routing is None:
        routing = record_routing(path, toks, fed, n_ubatch=eff_ubatch, max_ids=max_ids, decoded=decoded, **cp)
    assert prompt_run is not None and gen_run is not None
    routing.check_complete(sum(calls), sum(outputs))
    return RecordedRun(routing=routing, calls=calls, outputs=outputs, n_prompt=len(toks), n_gen=n_gen, budget=budget,
                       n_ubatch=n_ubatch,
                       prompt=prompt_run, gen=gen_run, misses=misses,
                       hit_s=None if None in hits else min(hits), flags=flags, n_ubatch_eff=eff_ubatch)
