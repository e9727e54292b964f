"""longhaul-cpp: llama.cpp with a longhaul load mode that streams MoE experts from the GGUF file."""
from importlib import metadata as _metadata

from ._lib import LlamaError, lib
from .fit import CacheFit, fit_longhaul_cache
from .longhaul import LayerStats, LonghaulStats, parse_cache_size, plain_expert_banks
from .context import Context, greedy_generate
from .model import Model
from .params import LoadMode, LonghaulFlag
from .routing import Routing, RoutingRecorder
from .llama.grammar import LlamaGrammar
from .llama import Llama
from .llama.llama_types import LlamaState, LogitsProcessorList, StoppingCriteriaList
from .models.spec import SyntheticSpec
from .models.writer import make_model
from .tools import tool_path

__all__ = [
    "CacheFit", "Context", "LayerStats", "Llama", "LlamaError", "LlamaGrammar", "LlamaState", "LogitsProcessorList",
    "StoppingCriteriaList", "LoadMode", "LonghaulFlag", "LonghaulStats", "Model",
    "Routing", "RoutingRecorder", "SyntheticSpec", "parse_cache_size",
    "fit_longhaul_cache", "greedy_generate", "make_model", "lib", "plain_expert_banks", "tool_path",
]
try:
    __version__ = _metadata.version("longhaul-cpp")  # pyproject.toml is the one place it is written
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
