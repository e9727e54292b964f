"""The llama-cpp-python-compatible API (0.3.36): `Llama`, its grammar, tokenizer and types, on this package's
Model and Context. One `Llama` class: completion, chat and embeddings are its methods (mixins of their modules)."""
from .grammar import LlamaGrammar
from .llama import Llama
from .llama_tokenizer import LlamaTokenizer
from .llama_types import LlamaState, LogitsProcessorList, StoppingCriteriaList

__all__ = ["Llama", "LlamaGrammar", "LlamaState", "LlamaTokenizer", "LogitsProcessorList", "StoppingCriteriaList"]
