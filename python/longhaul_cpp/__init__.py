"""longhaul-cpp: llama.cpp with a longhaul load mode that streams MoE experts from the GGUF file."""
from ._lib import LlamaError, lib
from .longhaul import LayerStats, LonghaulStats, parse_cache_size
from .model import Context, LoadMode, Model, greedy_generate
from .synthetic import SyntheticSpec, generate
from .tools import tool_path

__all__ = [
    "Context", "LayerStats", "LlamaError", "LoadMode", "LonghaulStats", "Model", "SyntheticSpec", "parse_cache_size",
    "generate", "greedy_generate", "lib", "tool_path",
]
__version__ = "0.1.0"
