"""mhalab: learn multi-head attention by computing, training and looking; one module per idea (the learners'
guide, website/learners.md, lists them). Train with ``from mhalab.train import train``: the package does not re-export
``train``, so ``mhalab.train`` stays the module. Importing mhalab touches no GPU.

The two mask helpers say what True means in them: ``causal_allowed_mask`` (True = may attend) goes with
``scaled_dot_product_attention``; ``causal_forbidden_mask`` (True = forbidden) with ``MultiHeadAttention``.
"""

from .arguments import valid_head_counts
from .attention import MultiHeadAttention
from .dot_product_attention import scaled_dot_product_attention
from .encoder_decoder import EncoderDecoder
from .kv_cache import KVCache
from .masks import causal_allowed_mask, causal_forbidden_mask
from .models import ModelConfig, Transformer
from .sweep import sweep_heads

__version__ = "0.1.0"

__all__ = ["EncoderDecoder", "KVCache", "ModelConfig", "MultiHeadAttention", "Transformer", "causal_allowed_mask",
           "causal_forbidden_mask", "scaled_dot_product_attention",
           "sweep_heads", "valid_head_counts", "__version__"]
