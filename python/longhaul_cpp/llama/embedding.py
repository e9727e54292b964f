"""`Llama.embed` and `Llama.create_embedding` as llama-cpp-python 0.3.36 computes them: inputs packed into
batches of up to n_batch tokens (one sequence each), a pooled vector per input, or with pooling NONE one
vector per token; optionally L2-normalized. Needs `Llama(embedding=True)`, which a normal load takes and
longhaul mode refuses (text generation only)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._lib import LlamaError, ffi, lib

if TYPE_CHECKING:
    from ..context import Context

POOLING_NONE = 0  # LLAMA_POOLING_TYPE_NONE


def _normalize(v: list[float]) -> list[float]:
    norm = float(np.linalg.norm(v))
    return v if norm == 0.0 else [x / norm for x in v]


class EmbeddingMixin:
    """`Llama.embed` and `Llama.create_embedding` (Llama's state, set by its constructor)."""

    _ctx: Context
    context_params: dict[str, Any]
    n_batch: int
    model_path: str

    if TYPE_CHECKING:  # Llama's own methods
        def n_embd(self) -> int: ...
        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
        def reset(self) -> None: ...

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,  # noqa: A002
              return_count: bool = False) -> Any:
        if not self.context_params.get("embeddings"):
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        L, ctx = lib(), self._ctx
        n_embd, n_batch = self.n_embd(), self.n_batch
        n_seq_max = int(self.context_params.get("n_seq_max", 1))
        pooled = int(L.llama_pooling_type(ctx.ptr)) != POOLING_NONE
        data: list[Any] = []
        mem = L.llama_get_memory(ctx.ptr)

        def run(seqs: list[list[int]]) -> None:
            if not seqs:
                return
            L.llama_memory_clear(mem, True)
            batch = L.llama_batch_init(sum(len(s) for s in seqs), 0, 1)
            try:
                i = 0
                for seq_id, toks in enumerate(seqs):
                    for pos, tok in enumerate(toks):
                        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                        batch.seq_id[i][0], batch.logits[i] = seq_id, 1
                        i += 1
                batch.n_tokens = i
                rc = L.llama_decode(ctx.ptr, batch)
            finally:
                L.llama_batch_free(batch)
            if rc != 0:
                raise LlamaError(f"llama_decode failed with code {rc} while embedding")
            if pooled:
                for seq_id in range(len(seqs)):
                    p = L.llama_get_embeddings_seq(ctx.ptr, seq_id)
                    v = list(np.frombuffer(ffi.buffer(p, n_embd * 4), np.float32).tolist())
                    data.append(_normalize(v) if normalize else v)
            else:
                rows = np.frombuffer(ffi.buffer(L.llama_get_embeddings(ctx.ptr), i * n_embd * 4), np.float32)
                start = 0
                for toks in seqs:
                    vs = [rows[(start + j) * n_embd:(start + j + 1) * n_embd].tolist() for j in range(len(toks))]
                    data.append([_normalize(v) for v in vs] if normalize else vs)
                    start += len(toks)

        inputs = [input] if isinstance(input, str) else list(input)
        total, seqs, n_tok = 0, [], 0
        for text in inputs:
            toks = self.tokenize(text.encode("utf-8"))
            if truncate:
                toks = toks[:n_batch]
            if len(toks) > n_batch:
                raise ValueError(f"Requested tokens ({len(toks)}) exceed batch size of {n_batch}")
            total += len(toks)
            if n_tok + len(toks) > n_batch or len(seqs) >= n_seq_max:
                run(seqs)
                seqs, n_tok = [], 0
            seqs.append(toks)
            n_tok += len(toks)
        run(seqs)
        L.llama_memory_clear(mem, True)
        self.reset()
        out = data[0] if isinstance(input, str) else data
        return (out, total) if return_count else out


    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:  # noqa: A002
        embeds, total = self.embed(input if isinstance(input, list) else [input], return_count=True)
        return {"object": "list", "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
                "model": model if model is not None else self.model_path,
                "usage": {"prompt_tokens": total, "total_tokens": total}}
