"""longhaul-cpp: llama.cpp with a longhaul load mode that streams MoE experts from the GGUF file."""
from importlib import metadata as _metadata

from ._lib import LlamaError, lib
from .longhaul import PLAIN_EXPERTS_ENV, LayerStats, LonghaulStats, parse_cache_size, plain_expert_banks
from .model import Context, LoadMode, Model, greedy_generate
from .synthetic import SyntheticSpec, generate
from .tools import tool_path

__all__ = [
    "PLAIN_EXPERTS_ENV", "Context", "LayerStats", "LlamaError", "LoadMode", "LonghaulStats", "Model", "SyntheticSpec", "parse_cache_size",
    "generate", "greedy_generate", "lib", "plain_expert_banks", "tool_path",
]
__version__ = _metadata.version("longhaul-cpp")  # pyproject.toml is the one place it is written
