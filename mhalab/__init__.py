"""mhalab: learn multi-head attention by computing, training and looking.

The modules, one idea each::

    mhalab.attention    scaled_dot_product_attention, MultiHeadAttention (hook points pattern, z)
    mhalab.masks        causal and padding masks
    mhalab.kv_cache     KVCache for decoding one token at a time
    mhalab.positions    sinusoidal position table, rotary embedding
    mhalab.hooks        run_with_cache, run_with_hooks, ablate_heads, gate_heads: the one way to look inside
    mhalab.counting     parameters and KV cache against the head count (cost_table)
    mhalab.models       ModelConfig, Transformer, EncoderDecoder built from MultiHeadAttention
    mhalab.tasks        synthetic tasks with ground-truth relations
    mhalab.train        TrainConfig, train, evaluate (checkpoints in mhalab.checkpoint)
    mhalab.sweep        sweep_heads: one model per head count at a fixed width
    mhalab.scores       head scores from attention patterns (relations, previous-token, entropy, ...)
    mhalab.ablation     switching heads off, head importance, pruning
    mhalab.widgets      head_explorer: sliders over every head (ipywidgets + matplotlib)
    mhalab.head_grid    head_grid: every head of one layer at a glance
    mhalab.plotting     heat maps and the figures the notebooks share
    mhalab.diagrams     the mechanism and a block, drawn from a real forward pass
    mhalab.parallelism  counting and timing attention operations across layers and heads
    mhalab.labs         auto-checked exercises

Train with ``from mhalab.train import train`` (the package does not re-export ``train``, so
``mhalab.train`` stays the module). Importing mhalab touches no GPU; devices are chosen when you train.
"""

from .attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
    valid_head_counts,
)
from .models import EncoderDecoder, ModelConfig, Transformer
from .sweep import sweep_heads

__version__ = "0.1.0"

__all__ = [
    "EncoderDecoder",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "Transformer",
    "causal_mask",
    "scaled_dot_product_attention",
    "sweep_heads",
    "valid_head_counts",
    "__version__",
]
