"""The routing record: the expert ids each routed MoE layer selected, read through a context's eval callback.

A `RoutingRecorder` passed to `Model.context(routing=...)` reads every `ffn_moe_topk-<il>` tensor the graph
computes (the ids build_moe_ffn selects, [n_expert_used, n_tokens] per ubatch) as the scheduler hands it to the
context's eval callback: any load (normal or longhaul), no library API. `recorder.routing()` gives a `Routing`:
per routed layer, the ids of every token it ran, in order ([n_tokens, n_expert_used], router order). Routing does
not depend on the budget (a longhaul load's output is a normal load's), so one recorded run can be replayed at
any budget (`longhaul_cpp.plan`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._lib import ffi, lib

DEFAULT_MAX_IDS = 64 * 1024 * 1024  # int32 values (256 MiB): 512 prompt tokens x 60 layers x top-8 is 0.25 M
_TOPK = b"ffn_moe_topk-"


class RoutingError(RuntimeError):
    pass


@dataclasses.dataclass
class Routing:
    layers: dict[int, np.ndarray]       # layer index -> int32 [n_tokens, n_expert_used], every token in order
    ubatches: dict[int, list[int]]      # layer index -> the tokens of each ubatch as it ran
    truncated: bool = False             # the record's bound ended it early

    @property
    def n_tokens(self) -> int:
        return max((len(a) for a in self.layers.values()), default=0)

    @classmethod
    def parse(cls, flat: np.ndarray, truncated: bool = False) -> Routing:
        """Entries [il, n_tokens, n_used, ids...] (RoutingRecorder.flat) -> per-layer token streams."""
        chunks: dict[int, list[np.ndarray]] = {}
        ubatches: dict[int, list[int]] = {}
        i, n = 0, len(flat)
        while i < n:
            if i + 3 > n:
                raise RoutingError(f"routing record cut inside an entry header at value {i} of {n}")
            il, n_tok, n_used = (int(v) for v in flat[i:i + 3])
            end = i + 3 + n_tok * n_used
            if il < 0 or n_tok < 0 or n_used <= 0 or end > n:
                raise RoutingError(f"malformed routing record entry at value {i}: layer {il}, {n_tok} tokens x "
                                   f"{n_used} ids, {n - i - 3} values left")
            chunks.setdefault(il, []).append(np.asarray(flat[i + 3:end], dtype=np.int32).reshape(n_tok, n_used))
            ubatches.setdefault(il, []).append(n_tok)
            i = end
        widths = {a.shape[1] for c in chunks.values() for a in c}
        if len(widths) > 1:
            raise RoutingError(f"routing record mixes {sorted(widths)} experts per token")
        return cls(layers={il: np.concatenate(c) for il, c in sorted(chunks.items())}, ubatches=ubatches,
                   truncated=truncated)

    def check_complete(self, n_tokens: int, n_outputs: int) -> None:
        """Every routed layer ran the run's tokens, or (the last layer, which runs only the tokens whose logits
        are wanted) its outputs: a run whose record is whole."""
        if self.truncated:
            raise RoutingError("the routing record was truncated by its bound: record fewer tokens or raise max_ids")
        short = {il: len(a) for il, a in self.layers.items() if len(a) not in (n_tokens, n_outputs)}
        if not self.layers or short:
            raise RoutingError(f"the routing record does not cover the {n_tokens} tokens ({n_outputs} outputs) the "
                               f"run decoded (layers and their tokens: {short or 'none recorded'})")


class RoutingRecorder:
    """Records the expert ids of every routed MoE layer through a context's eval callback (pass it to
    `Model.context(routing=recorder)`), bounded to `max_ids` int32 values (entries are never cut: the record
    ends, marked truncated). Off until `start()`; `stop()` ends it; read it with `routing()` between decodes.
    `arch`: the model's architecture. One whose layers call build_moe_ffn twice on the same router
    probabilities (GroveMoE: its chunk experts, which are not streamed) repeats a layer's ids at once in the
    same graph; for it that repetition is dropped (elsewhere the same ids twice in a row are two ubatches)."""

    TWICE_PER_LAYER = frozenset({"grovemoe"})

    def __init__(self, arch: str = "") -> None:
        self.twice_per_layer = arch in self.TWICE_PER_LAYER
        self.active = False
        self.truncated = False
        self.max_ids = 0
        self._n = 0
        self._entries: list[tuple[int, np.ndarray]] = []
        self._callback = ffi.callback("bool(struct ggml_tensor *, bool, void *)", self._on_eval, onerror=self._error)
        self.error: BaseException | None = None

    @property
    def callback(self) -> Any:
        """The `ggml_backend_sched_eval_callback` (kept alive by this object)."""
        return self._callback

    def start(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        """A new record of at most max_ids int32 values."""
        if max_ids <= 0:
            raise ValueError("max_ids must be positive")
        self.max_ids, self._n, self._entries, self.truncated, self.error = int(max_ids), 0, [], False, None
        self.active = True

    def stop(self) -> None:
        self.active = False

    def _error(self, exc_type: type, exc: BaseException, tb: Any) -> None:  # never let it cross into C
        self.error, self.active = exc, False

    def _on_eval(self, t: Any, ask: bool, _user_data: Any) -> bool:
        name = ffi.string(t.name) if self.active else b""
        if not name.startswith(_TOPK):
            return False if ask else True
        if ask:
            return True
        il = int(name[len(_TOPK):])
        n_used, n_tokens = int(t.ne[0]), int(t.ne[1])
        raw = np.empty(int(lib().ggml_nbytes(t)), dtype=np.uint8)  # a view: its strided extent
        lib().ggml_backend_tensor_get(t, ffi.from_buffer(raw), 0, raw.nbytes)
        ids = np.ndarray((n_tokens, n_used), dtype=np.int32, buffer=raw, strides=(int(t.nb[1]), int(t.nb[0]))).copy()
        if self.twice_per_layer and self._entries:
            last_il, last = self._entries[-1]
            if last_il == il and len(last) == n_tokens and n_used <= last.shape[1] and \
                    np.array_equal(last[:, :n_used], ids):
                return True  # the same layer's ids again, in the same graph
        if self._n + 3 + ids.size > self.max_ids:
            self.truncated, self.active = True, False
            return True
        self._entries.append((il, ids))
        self._n += 3 + ids.size
        return True

    def flat(self) -> np.ndarray:
        """The record as entries [il, n_tokens, n_used, ids of token 0, token 1, ...], in the order they ran."""
        parts = [np.concatenate([np.array([il, *ids.shape], dtype=np.int32), ids.ravel()]) for il, ids in self._entries]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def routing(self) -> Routing:
        """The routing recorded since `start()`."""
        if self.error is not None:
            raise RoutingError(f"the routing record failed in the eval callback: {self.error!r}")
        return Routing.parse(self.flat(), truncated=self.truncated)
