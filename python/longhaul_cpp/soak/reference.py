"""The soak's reference: each prompt's answer from a normal load of the model (the package's binding, the server's
batch sizes and threads), greedy, with the margin between the two best logits at every generated position.

A server batches its slots' tokens together, and the batch a token lands in changes the kernels' summation order,
so where the two best logits of a position are within a hair the batch decides the token: the normal server does
the same (the same prompt answered alone and beside three others differ there). An answer is equal when its tokens
are the reference's, and excused when it leaves the reference only at such a near-tie."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..model import Model
from .clients import same_answer

NEAR_TIE = 0.05  # logits: the two best closer than this at the first differing position excuse the difference


@dataclasses.dataclass
class Reference:
    tokens: list[int]        # the generated ids (greedy, stopping at end of generation)
    margins: list[float]     # best - second best logit at each generated position
    prefixes: list[str]      # the text of tokens[:j] for every j (the answer's text is prefixes[-1])

    def judge(self, got_tokens: list[int] | None, got_text: str) -> str:
        """"equal", "near-tie" (left the reference at a position whose two best logits are within NEAR_TIE) or
        "differs". Tokens when the answer has them (plain requests), else its text (a stream)."""
        if got_tokens is not None:
            if got_tokens == self.tokens:
                return "equal"
            d = next((i for i, (a, b) in enumerate(zip(got_tokens, self.tokens)) if a != b),
                     min(len(got_tokens), len(self.tokens)))
            return "near-tie" if d < len(self.margins) and self.margins[d] < NEAR_TIE else "differs"
        if same_answer(got_text, self.prefixes[-1]):
            return "equal"
        ties = [j for j, m in enumerate(self.margins) if m < NEAR_TIE]
        return "near-tie" if any(got_text.startswith(self.prefixes[j].rstrip("\ufffd")) for j in ties) else "differs"


def reference_answers(model: Path, prompts: list[str], n_predict: int, *, threads: int, n_ctx: int) -> list[Reference]:
    out = []
    with Model(model) as m, \
            m.context(n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_threads=threads) as ctx:
        for p in prompts:
            ctx.reset()
            ctx.decode(m.tokenize(p))
            toks: list[int] = []
            margins: list[float] = []
            for _ in range(n_predict):
                lg = ctx.logits()
                t = int(np.argmax(lg))
                top2 = np.partition(lg, -2)[-2:]
                margins.append(float(top2[1] - top2[0]))
                if m.is_eog(t):
                    break
                toks.append(t)
                ctx.decode([t])
            out.append(Reference(toks, margins, [m.detokenize(toks[:j]) for j in range(len(toks) + 1)]))
    return out
