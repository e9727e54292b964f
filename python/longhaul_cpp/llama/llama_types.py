"""llama-cpp-python's helper types for `Llama`: the saved state, logits processors, stopping criteria."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list[LogitsProcessor]):
    """Processors applied in order to (the tokens evaluated so far, the next token's logits)."""

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list[StoppingCriteria]):
    """Generation stops (finish_reason "stop") as soon as one criterion returns True."""

    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbids the end-of-sequence token until `min_tokens` tokens were generated."""

    def __init__(self, min_tokens: int, token_eos: int) -> None:
        self.min_tokens, self.token_eos = min_tokens, token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


class LlamaState:
    """What `Llama.save_state()` returns: the context's memory and the evaluated tokens (and their logits
    with logits_all), restored by `load_state()` on a Llama of the same model and context size."""

    def __init__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single], n_tokens: int,
                 llama_state: bytes, llama_state_size: int, seed: int) -> None:
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed
