"""The pieces of a synthetic model's tensor inventory, shared by the writers (synthetic_gguf, synthetic_families,
published): a tensor's definition, its random generator, the router's fill."""
from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable

import numpy as np

from .spec import SyntheticSpec


def rng_for(seed: int, name: str) -> np.random.Generator:
    """The generator of one tensor: seeded by (seed, tensor name), so the same spec gives the same bytes."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


@dataclasses.dataclass
class TensorDef:
    name: str
    shape: tuple[int, ...]  # ggml ne order
    kind: str               # "norm" | "matrix" | "expert" | "custom"
    std: float = 1.0
    fill: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray] | None = None


def layer_skew(spec: SyntheticSpec, il: int) -> float:
    """The router skew of layer il: router_skew * (1 + router_skew_spread * x), x in [-1, 1) from the golden-ratio
    sequence of the layer index (layers differ, spread evenly, in no monotone order)."""
    x = 2.0 * ((il * 0.6180339887498949) % 1.0) - 1.0
    return max(0.0, spec.router_skew * (1.0 + spec.router_skew_spread * x))


def router_fill(spec: SyntheticSpec, il: int = 0) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    """Router rows ~ N(0, 1/n_embd); with a skew > 0 (layer_skew), row e is scaled by (1 + rank_e) ** -skew
    (ranks a random permutation per layer), so a few experts win the top-k far more often:
    a Zipf-like popularity instead of uniform routing."""
    inv_e = np.float32(1.0 / math.sqrt(spec.n_embd))
    skew = layer_skew(spec, il)

    def fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        w = rng.standard_normal(shape, dtype=np.float32) * inv_e
        if skew > 0:
            rank = rng.permutation(shape[0])
            w *= ((1.0 + rank) ** -skew).astype(np.float32)[:, None]
        return w

    return fill
