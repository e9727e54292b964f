"""The routing record: the expert ids each routed MoE layer selected, read from the library.

`Model.record_routing()` starts it (llama_model_longhaul_record_routing), `Model.routing()` reads it back as a
`Routing`: per routed layer, the ids of every token it ran, in order ([n_tokens, n_expert_used], router order).
Routing does not depend on the budget (a longhaul load's output is a normal load's), so one recorded run can be
replayed at any budget (`longhaul_cpp.plan`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

DEFAULT_MAX_IDS = 64 * 1024 * 1024  # int32 values (256 MiB): 512 prompt tokens x 60 layers x top-8 is 0.25 M


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
        """Entries [il, n_tokens, n_used, ids...] (llama_model_longhaul_routing) -> per-layer token streams."""
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
