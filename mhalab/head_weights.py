"""Every head's weights, read from a model as TransformerLens reads them after ``fold_ln``: :func:`layer_weights`
(one attention layer), :func:`head_weights` (every layer, the embeddings and the unembedding) and
:func:`unembedding_weights`.

The scale of the norm before each attention layer is folded into its W_Q, W_K, W_V and that of the final norm into
W_U, and, where the norm is a LayerNorm, those reading weights are centred (each column's mean over the D rows taken
out), because a LayerNorm's output has no component along the all-ones direction, so that component of a reading
weight never acts; RMSNorm's output has one, so its weights are not centred. (The norms' biases go into the biases;
TransformerLens's further ``center_writing_weights`` and ``center_unembed`` are not applied.) These are what the
models' ``model.W_Q``, ``model.W_K``, ``model.W_V``, ``model.W_O``, ``model.W_U``, ``model.b_U`` return and what
:mod:`mhalab.circuits` reads. Grouped-query models: ``W_K`` and ``W_V`` hold the G K/V heads as stored
(TransformerLens 4's convention); query head h reads K/V head ``h // (H // G)``. Shapes: N layers, H query heads,
G K/V heads, D d_model, d d_head, V vocabulary, P positions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["LayerWeights", "layer_weights", "HeadWeights", "head_weights", "unembedding_weights"]


class LayerWeights(NamedTuple):
    """One attention layer's per-head matrices: ``W_Q [H, D, d]``, ``W_K, W_V [G, D, d]``, ``W_O [H, d, D]``."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor


def _fold(norm: nn.Module | None, W: Tensor) -> Tensor:
    """``W [..., D, n]`` read through ``norm``: its scale folded in (``diag(w) W``) and, a LayerNorm's, the D rows
    centred (``W - mean over D``), as TransformerLens's ``fold_ln``; no norm (or ``nn.Identity``): ``W``."""
    weight = getattr(norm, "weight", None)
    if weight is None:
        return W
    W = W * weight.detach()[:, None]  # [..., D, n] * [D, 1]
    return W - W.mean(-2, keepdim=True) if isinstance(norm, nn.LayerNorm) else W


def layer_weights(attn: nn.Module, *, fold_ln: bool = True) -> LayerWeights:
    """The per-head matrices of the :class:`~mhalab.attention.MultiHeadAttention` ``attn`` (detached), with the
    norm it reads through folded in (``fold_ln``; see the module's docstring), or as stored."""
    H, G, d, D = attn.n_heads, attn.n_key_value_heads, attn.d_head, attn.d_model
    rows = attn.qkv_proj.weight.detach().view(H + 2 * G, d, D)  # [(H + 2G) d, D] -> a [d, D] block per head
    W_Q, W_K, W_V = rows.transpose(-2, -1).split([H, G, G])  # [n, D, d] each: x @ W is the head's q, k or v
    W_O = attn.out_proj.weight.detach().view(D, H, d).permute(1, 2, 0)  # [D, H d] -> [D, H, d] -> [H, d, D]
    norm = attn.input_norm if fold_ln else None
    return LayerWeights(_fold(norm, W_Q), _fold(norm, W_K), _fold(norm, W_V), W_O)


class HeadWeights(NamedTuple):
    """Every layer's weights: ``W_Q [N, H, D, d]``, ``W_K, W_V [N, G, D, d]`` (the K/V heads as stored),
    ``W_O [N, H, d, D]``; ``W_E [V, D]``; ``W_pos [P, D]`` or None (no position table); ``W_U [D, V]``, ``b_U [V]``
    or None (no unembedding, or no bias); ``n_key_value_heads`` (G)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    W_E: Tensor
    W_pos: Tensor | None
    W_U: Tensor | None
    b_U: Tensor | None
    n_key_value_heads: int


_NO_UNEMBEDDING = ("this model has no unembedding (W_U): it outputs vectors, not next-token logits, so circuits "
                   "through W_U (full OV circuit, direct logit attribution, logit lens) do not exist for it")


def unembedding_weights(model: nn.Module, *, fold_ln: bool = True) -> tuple[Tensor, Tensor | None]:
    """``W_U [D, V]`` and ``b_U [V]`` (or None) of a pre-norm ``Transformer``, with the final norm folded in
    (``fold_ln``): ``norm(x) @ W_U + b_U`` = ``normalized(x) @ (diag(w) W_U) + (b_norm @ W_U + b_U)``, then W_U
    centred over D for a LayerNorm."""
    if model.config.post_norm:
        raise ValueError(_NO_UNEMBEDDING)
    if model.config.n_targets != 1:
        raise ValueError(f"this model predicts {model.config.n_targets} targets per position (its head is "
                         f"[{model.config.n_targets} x d_vocab, d_model]); the unembedding and the circuits through it "
                         "need one (ModelConfig(n_targets=1))")
    W_E = model.embed.tokens.weight.detach()
    W_U = W_E.T if model.head is None else model.head.weight.detach().T  # [D, V]; tied: W_U = W_Eᵀ
    b_U = None if model.head is None or model.head.bias is None else model.head.bias.detach()
    norm = model.ln_final
    bias = getattr(norm, "bias", None)
    if fold_ln and bias is not None:
        b_U = bias.detach() @ W_U + (0.0 if b_U is None else b_U)  # [D] @ [D, V] -> [V]
    return (_fold(norm, W_U) if fold_ln else W_U), b_U


def _transformer_weights(model: nn.Module, fold: bool) -> HeadWeights:
    cfg = model.config
    embed = model.embed
    table = embed.positions.weight if embed.learned else getattr(embed, "positions_table", None)
    W_E = embed.tokens.weight.detach()  # [V, D]
    layers = [layer_weights(block.attn, fold_ln=fold) for block in model.blocks]
    W_Q, W_K, W_V, W_O = (torch.stack(t) for t in zip(*layers))  # each [N, ...]
    G = cfg.n_key_value_heads or cfg.n_heads
    W_pos = None if table is None else table.detach()
    if cfg.post_norm:
        # Post-norm (MiniLM: a norm after each sublayer): the model's output is its last residual, with no
        # unembedding trained (the checkpoint has no MLM head).
        return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_pos, None, None, G)
    W_U, b_U = unembedding_weights(model, fold_ln=fold)
    return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_pos, W_U, b_U, G)


def _validate_transformer(model: nn.Module) -> None:
    from .models import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(f"circuits reads a mhalab Transformer (the toy models, SmolLM2, MiniLM), "
                        f"got {type(model).__name__}")


def head_weights(model: nn.Module, *, fold_ln: bool = True) -> HeadWeights:
    """The weights every circuit here is read from (see :class:`HeadWeights`), for any mhalab ``Transformer``:
    the toy models, SmolLM2 and MiniLM (each a ``Transformer`` of one ``ModelConfig``); ``fold_ln=False``: as
    stored (no norm folded in, nothing centred)."""
    _validate_transformer(model)
    return _transformer_weights(model, fold_ln)


def _attention_weights(model) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every layer's folded ``W_Q, W_K, W_V, W_O`` from a :class:`HeadWeights` or a model (no W_U formed)."""
    if isinstance(model, HeadWeights):
        return model.W_Q, model.W_K, model.W_V, model.W_O
    _validate_transformer(model)
    return tuple(torch.stack(t) for t in zip(*(layer_weights(block.attn) for block in model.blocks)))
