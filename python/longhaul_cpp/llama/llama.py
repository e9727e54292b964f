"""`Llama`: llama-cpp-python 0.3.36's high-level API over the package's Model and Context, with the longhaul
load mode as two more keyword arguments. A script written for llama-cpp-python switches by its import:

    from longhaul_cpp import Llama
    llm = Llama("model.gguf", n_ctx=4096, load_mode="longhaul", longhaul_cache="auto")
    llm.create_chat_completion([{"role": "user", "content": "Hi"}])["choices"][0]["message"]["content"]

The constructor takes llama-cpp-python's arguments with its defaults; completions, chat completions,
tokenize / detokenize, eval / generate, save_state / load_state, set_seed and reset behave as there,
including the reuse of the prompt prefix the context already holds. What this package cannot honour
is refused by name with the reason (llama_args.py).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .._lib import LlamaError, lib, logger
from .chat import ChatMixin, resolve_formatter
from ..context import Context
from .grammar import LlamaGrammar
from .llama_args import LlamaArgs, configure_verbose
from .llama_types import LlamaState, LogitsProcessorList, StoppingCriteriaList
from ..longhaul import LonghaulStats, is_auto_budget
from ..model import Model
from .sampling import DEFAULT_SEED, Sampler, SamplingParams
from .completion import CompletionMixin
from .embedding import EmbeddingMixin
from .llama_tokenizer import LlamaTokenizer


class Llama(CompletionMixin, ChatMixin, EmbeddingMixin):
    """A model and one context, as llama-cpp-python's `Llama` (see the module's docstring); completions, chat
    and embeddings are its methods from the mixins of completion.py, chat.py and embedding.py.

    Beyond llama-cpp-python's arguments: `load_mode` ("longhaul", "mmap", ... or a LoadMode; default:
    from use_mmap / use_mlock as there) and `longhaul_cache` ("2GiB", 2, "auto"); other keyword arguments
    are `llama_model_params` or `llama_context_params` fields (longhaul_flags=, longhaul_io_threads=, ...).
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_gpu_layers: int = 0, split_mode: int = 1,
                 main_gpu: int = 0, tensor_split: list[float] | None = None, vocab_only: bool = False,
                 use_mmap: bool = True, use_mlock: bool = False,
                 kv_overrides: dict[str, bool | int | float | str] | None = None, seed: int = DEFAULT_SEED,
                 n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, rope_scaling_type: int | None = -1, pooling_type: int = -1,
                 attention_type: int = -1, rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0,
                 yarn_ext_factor: float = -1.0, yarn_attn_factor: float = 1.0, yarn_beta_fast: float = 32.0,
                 yarn_beta_slow: float = 1.0, yarn_orig_ctx: int = 0, logits_all: bool = False,
                 embedding: bool = False, offload_kqv: bool = True, flash_attn: bool = False,
                 op_offload: bool | None = None, swa_full: bool | None = None, no_perf: bool = False,
                 last_n_tokens_size: int = 64, lora_base: str | None = None, lora_scale: float = 1.0,
                 lora_path: str | None = None, numa: bool | int = False, chat_format: str | None = None,
                 chat_handler: Any = None, draft_model: Any = None, tokenizer: Any = None,
                 type_k: int | None = None, type_v: int | None = None, spm_infill: bool = False,
                 verbose: bool = True, load_mode: Any = None, longhaul_cache: float | int | str | None = None,
                 **kwargs: Any) -> None:
        self.verbose = verbose
        configure_verbose(verbose)
        args = LlamaArgs.build(locals())
        self.model_path = str(model_path)
        self._seed = seed or DEFAULT_SEED
        self.last_n_tokens_size = last_n_tokens_size
        self._logits_all = logits_all
        self.spm_infill = spm_infill
        self.lora_path, self.lora_base, self.lora_scale = lora_path, lora_base, lora_scale
        self.chat_handler, self.draft_model, self.cache = chat_handler, None, None
        self._model = Model(model_path, load_mode=args.load_mode, longhaul_cache=longhaul_cache,
                            context_params=dict(args.context) if is_auto_budget(longhaul_cache) else None,
                            **args.model)
        try:
            args.finish_context(self._model)
            self.context_params = args.context
            self._ctx: Context = self._model.context(**args.context)
            self._lora = args.attach_lora(self._model, self._ctx)
        except BaseException:
            self._model.close()
            raise
        self.n_batch = args.context["n_batch"]
        self._n_ctx = self._ctx.n_ctx
        self._n_vocab = self._model.n_vocab
        self.tokenizer_ = tokenizer
        self.input_ids = np.zeros(self._n_ctx, dtype=np.intc)
        self.scores = np.zeros((self._n_ctx if logits_all else self.n_batch, self._n_vocab), dtype=np.single)
        self.n_tokens = 0
        self.chat_format, self._formatter = (None, None) if chat_handler else resolve_formatter(self._model, chat_format)
        if self._model.is_longhaul:
            logger.info("%s", self._model.longhaul_plan(self._ctx.n_ubatch))

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """A model from the Hugging Face Hub, as llama-cpp-python's `Llama.from_pretrained`: `filename` is a glob
        over the repository's files that must name one model (all shards of a split GGUF are fetched, the model
        loads from the first), `additional_files` globs of more files to fetch; `kwargs` go to `Llama(...)`
        (load_mode="longhaul", longhaul_cache=... too). Needs huggingface_hub (`pip install "longhaul-cpp[hub]"`);
        offline (HF_HUB_OFFLINE=1) the files come from the local hub cache (hub.py)."""
        from .hub import fetch

        path = fetch(repo_id, filename, additional_files=additional_files, local_dir=local_dir,
                     local_dir_use_symlinks=local_dir_use_symlinks, cache_dir=cache_dir)
        return cls(model_path=path, **kwargs)

    # -- lifetime --
    def close(self) -> None:
        self._model.close()  # closes the context too

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- properties as llama-cpp-python has them --
    @property
    def model(self) -> Model:
        return self._model

    @property
    def ctx(self) -> Context:
        return self._ctx

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[:self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[:self.n_tokens, :]

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_embd(self) -> int:
        return self._model.n_embd

    def n_vocab(self) -> int:
        return self._n_vocab

    def token_bos(self) -> int:
        return self._model.token_bos()

    def token_eos(self) -> int:
        return self._model.token_eos()

    def token_nl(self) -> int:
        return int(lib().llama_vocab_nl(self._model._vocab))

    @property
    def metadata(self) -> dict[str, str]:
        return {k: v for k in self._model.meta_keys() if (v := self._model.meta(k, limit=1 << 20)) is not None}

    def longhaul_stats(self) -> LonghaulStats:
        return self._model.longhaul_stats()

    # -- vocabulary --
    def tokenizer(self) -> LlamaTokenizer:
        """The llama tokenizer of this model (llama-cpp-python's `Llama.tokenizer()`)."""
        return LlamaTokenizer(self)

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text` (UTF-8 bytes; str is accepted too), with BOS when the model adds one."""
        if self.tokenizer_ is not None:
            return list(self.tokenizer_.tokenize(text if isinstance(text, bytes) else text.encode(), add_bos, special))
        s = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else text
        return [int(t) for t in self._model.tokenize(s, add_special=add_bos, parse_special=special)]

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of the tokens' pieces; a space after a leading BOS is dropped (llama-cpp-python's rule)."""
        if self.tokenizer_ is not None:
            return self.tokenizer_.detokenize(list(tokens), prev_tokens=prev_tokens, special=special)
        out = b"".join(self._model.token_to_piece(int(t), special=special) for t in tokens)
        if len(tokens) and int(tokens[0]) == self.token_bos() and out[:1] == b" ":
            return out[1:]
        return out

    # -- state --
    def set_cache(self, cache: Any) -> None:
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> None:
        """Forget the evaluated tokens: the next eval starts at position 0."""
        self.n_tokens = 0
        lib().llama_memory_clear(lib().llama_get_memory(self._ctx.ptr), True)

    def save_state(self) -> LlamaState:
        data = self._ctx.state_get()[:-8]  # the context's bytes, without Context's own position suffix
        return LlamaState(input_ids=self.input_ids.copy(), scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=data, llama_state_size=len(data), seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        self._ctx.state_set(bytes(state.llama_state)[:state.llama_state_size] + state.n_tokens.to_bytes(8, "little"))
        rows = min(len(state.scores), len(self.scores))
        self.scores[:rows] = state.scores[:rows]
        self.input_ids = state.input_ids.copy()
        self.n_tokens = state.n_tokens
        self._seed = state.seed

    # -- evaluation and sampling --
    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate `tokens` after the ones evaluated so far (in batches of n_batch)."""
        mem = lib().llama_get_memory(self._ctx.ptr)
        lib().llama_memory_seq_rm(mem, -1, self.n_tokens, -1)
        toks = [int(t) for t in tokens]
        for i in range(0, len(toks), self.n_batch):
            batch = toks[i:i + self.n_batch]
            n_past = self.n_tokens
            if n_past + len(batch) > self._n_ctx:
                raise ValueError(f"Requested tokens ({n_past + len(batch)}) exceed context window of {self._n_ctx}")
            self._ctx.n_past = n_past
            self._ctx.decode(batch, all_logits=self._logits_all)
            self.input_ids[n_past:n_past + len(batch)] = batch
            if self._logits_all:
                for j in range(len(batch)):
                    self.scores[n_past + j] = self._ctx.logits(j)
            self.n_tokens += len(batch)

    def _sampler(self, sp: SamplingParams, grammar: LlamaGrammar | None,
                 logits_processor: LogitsProcessorList | None) -> Sampler:
        return Sampler(self._model, sp, grammar=None if grammar is None else grammar._grammar,
                       logits_processor=logits_processor)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
               idx: int | None = None) -> int:
        """One token from the last evaluated token's logits with a fresh sampler."""
        if self.n_tokens == 0:
            raise LlamaError("nothing evaluated yet: eval() a prompt before sample()")
        sp = self._params(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty, presence_penalty,
                          mirostat_mode, mirostat_tau, mirostat_eta, self._seed)
        with self._sampler(sp, grammar, logits_processor) as s:
            return s.sample(self._ctx, self._input_ids)

    def _params(self, top_k: int, top_p: float, min_p: float, typical_p: float, temp: float, repeat_penalty: float,
                frequency_penalty: float, presence_penalty: float, mirostat_mode: int, mirostat_tau: float,
                mirostat_eta: float, seed: int) -> SamplingParams:
        return SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, penalty_last_n=self.last_n_tokens_size,
                              mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                              seed=seed)

    def _reuse_prefix(self, tokens: list[int]) -> list[int]:
        """What is left to evaluate of `tokens` after keeping the longest prefix the context already holds (at
        least one token is evaluated again so that its logits are fresh); all of it when none is kept or the
        memory cannot drop a suffix (recurrent state): then the context starts over."""
        if self.n_tokens > 0:
            n = min(self.n_tokens, len(tokens))
            eq = self._input_ids[:n] == np.asarray(tokens[:n], dtype=np.intc)
            same = n if eq.all() else int(np.argmin(eq))
            keep = same - 1 if same == len(tokens) else same
            mem = lib().llama_get_memory(self._ctx.ptr)
            if keep > 0 and lib().llama_memory_seq_rm(mem, -1, keep, -1):
                self.n_tokens = keep
                if self.verbose:
                    logger.info("Llama.generate: %d prefix-match hit, remaining %d prompt tokens to eval",
                                keep, len(tokens) - keep)
                return tokens[keep:]
        self.reset()
        return tokens

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 grammar: LlamaGrammar | None = None) -> Iterator[int]:
        """Evaluate `tokens` (reusing the prefix the context holds when `reset`, else appending) and yield
        sampled tokens, each evaluated before the next is drawn, until the caller stops or a stopping
        criterion returns True."""
        sp = self._params(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty, presence_penalty,
                          mirostat_mode, mirostat_tau, mirostat_eta, self._seed)
        todo = list(tokens)
        if reset:
            todo = self._reuse_prefix(todo)
        with self._sampler(sp, grammar, logits_processor) as sampler:
            while True:
                if todo:
                    self.eval(todo)
                token = sampler.sample(self._ctx, self._input_ids)
                if stopping_criteria is not None and stopping_criteria(self._input_ids, self._ctx.logits().copy()):
                    return
                extra = yield token
                todo = [token] + list(extra or [])

    def pooling_type(self) -> int:
        return int(lib().llama_pooling_type(self._ctx.ptr))
