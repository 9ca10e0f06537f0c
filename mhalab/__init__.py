"""mhalab: learn multi-head attention by computing, training and looking.

Importing mhalab touches no GPU; devices are chosen when you train.
"""

from .attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
    valid_head_counts,
)

__version__ = "0.1.0"

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "causal_mask",
    "scaled_dot_product_attention",
    "valid_head_counts",
    "__version__",
]
