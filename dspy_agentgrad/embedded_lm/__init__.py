"""The embedded offline LM: a packaged GGUF model run in-process by llama.cpp, with
grammar-constrained output so DSPy's adapters always parse. ``llama_cpp`` is imported
on the first generation only."""

from .engine import LlamaCppEngine, local_lm
from .grammar import GRAMMAR_VERSION, OutputLimits
from .models import DEFAULT_MODEL, MODELS, available_models, model_path

__all__ = [
    "DEFAULT_MODEL",
    "GRAMMAR_VERSION",
    "MODELS",
    "LlamaCppEngine",
    "OutputLimits",
    "available_models",
    "local_lm",
    "model_path",
]
