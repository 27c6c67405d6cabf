"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), complete."""

from .config import ModelConfig, PRESETS
from .model import Transformer, count_parameters

__all__ = ["ModelConfig", "PRESETS", "Transformer", "count_parameters"]
__version__ = "0.1.0"
