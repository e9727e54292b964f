"""The model generators: synthetic GGUF models of every family (random weights, byte-level vocabulary, single file
or split), published files' tensor inventories at real scale, and the routers that shape their expert routing."""
from .writer import make_model
from .spec import SyntheticSpec

__all__ = ["SyntheticSpec", "make_model"]
