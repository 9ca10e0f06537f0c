"""The parts every model here is built from: one :class:`Block` (pre- or post-norm, LayerNorm or :class:`RMSNorm`,
:class:`MLP`, :class:`GatedMLP` or none, optional cross-attention), each made from a :class:`ModelConfig` by
:meth:`Block.from_config`. Shapes: B batch, T length, S source length, D d_model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .hook_points import HookPoint
from .kv_cache import KVCache

__all__ = ["activation", "MLP", "GatedMLP", "RMSNorm", "norm_layer", "attention_layer", "Block"]


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"), "relu": F.relu, "silu": F.silu,
}


def activation(act_fn: str) -> Callable[[Tensor], Tensor]:
    """The function TransformerLens calls ``act_fn`` (``"gelu"``, ``"gelu_new"``, ``"relu"``, ``"silu"``)."""
    if act_fn not in _ACTIVATIONS:
        raise ValueError(f"act_fn must be one of {tuple(_ACTIVATIONS)}, got {act_fn!r}")
    return _ACTIVATIONS[act_fn]


class MLP(nn.Module):
    """Position-wise feed-forward network: ``[B, T, D] -> [B, T, d_mlp] -> [B, T, D]``, GELU unless ``act_fn``."""

    def __init__(self, d_model: int, d_mlp: int, dropout: float = 0.0, act_fn: str = "gelu") -> None:
        super().__init__()
        self.act = activation(act_fn)
        self.fc_in = nn.Linear(d_model, d_mlp)
        self.fc_out = nn.Linear(d_mlp, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(self.fc_out(self.act(self.fc_in(x))), self.dropout, self.training)


class GatedMLP(nn.Module):
    """Gated feed-forward network, SwiGLU with ``act_fn="silu"`` (Shazeer 2020; Llama): ``down(act(gate(x)) * up(x))``,
    no biases, ``[B, T, D] -> [B, T, d_mlp] -> [B, T, D]``."""

    def __init__(self, d_model: int, d_mlp: int, act_fn: str = "silu") -> None:
        super().__init__()
        self.act = activation(act_fn)
        self.gate = nn.Linear(d_model, d_mlp, bias=False)
        self.up = nn.Linear(d_model, d_mlp, bias=False)
        self.down = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (no centring, no bias), in float32 or wider."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # half precision in float32; float64 stays
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def norm_layer(config: ModelConfig) -> nn.Module:
    """The norm ``config.normalization_type`` names: ``nn.LayerNorm`` ("LN") or :class:`RMSNorm` ("RMS")."""
    if config.normalization_type == "RMS":
        return RMSNorm(config.d_model, config.eps)
    return nn.LayerNorm(config.d_model, eps=config.eps)


def attention_layer(config: ModelConfig, *, rotary: bool | None = None) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` of ``config``'s shape (rotary if ``positions="rotary"``, or as ``rotary`` says)."""
    rotary = config.positions == "rotary" if rotary is None else rotary
    return MultiHeadAttention(
        config.d_model, config.n_heads, n_kv_heads=config.n_key_value_heads, d_head=config.d_head, bias=config.bias,
        dropout=config.dropout, rope_base=config.rotary_base if rotary else None,
    )


class Block(nn.Module):
    """One transformer block, as every model here builds it: self-attention, optionally cross-attention to
    an encoder's output, optionally an MLP, each on a residual branch.

    Pre-norm (GPT-2, Llama; the toy models): ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, stable without
    warm-up. Post-norm (the 2017 paper, BERT): ``norm(x + attn(x))``, then ``norm(x + mlp(x))``. ``norm`` makes
    the norm layers (``nn.LayerNorm``, :class:`RMSNorm`), ``mlp`` is :class:`MLP`, :class:`GatedMLP` or None
    (attention-only). Hook points (axes in :mod:`mhalab.hooks`): ``hook_resid_pre``, ``hook_attn_out``,
    ``hook_resid_mid`` (when a sublayer follows the attention), ``hook_cross_attn_out`` and
    ``hook_resid_mid_cross`` (decoder blocks; the latter before an MLP), ``hook_mlp_out``, ``hook_resid_post``.
    In a post-norm block the residual points are the sums before the norm, as in TransformerLens's BERT.
    """

    def __init__(
        self, attn: MultiHeadAttention, mlp: nn.Module | None, norm: Callable[[], nn.Module], *,
        cross_attn: MultiHeadAttention | None = None, post_norm: bool = False, dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.post_norm, self.dropout = post_norm, dropout
        self.has_cross, self.has_mlp = cross_attn is not None, mlp is not None
        # Registered in the order they run, so hook_points(model) lists them so.
        self.hook_resid_pre = HookPoint()  # [B, T, D]
        self.ln_attn = norm()
        self.attn = attn
        self.hook_attn_out = HookPoint()  # [B, T, D]: what the attention adds to the stream
        if self.has_cross or self.has_mlp:
            self.hook_resid_mid = HookPoint()  # [B, T, D]
        if self.has_cross:
            self.ln_cross = norm()
            self.cross_attn = cross_attn
            self.hook_cross_attn_out = HookPoint()  # [B, T, D]
            if self.has_mlp:
                self.hook_resid_mid_cross = HookPoint()  # [B, T, D]
        if self.has_mlp:
            self.ln_mlp = norm()
            self.mlp = mlp
            self.hook_mlp_out = HookPoint()  # [B, T, D]
        self.hook_resid_post = HookPoint()  # [B, T, D]
        names = ["hook_resid_mid", "hook_resid_mid_cross", "hook_resid_post"]
        self._resid_points = [p for p in (getattr(self, n, None) for n in names) if p is not None]

    @classmethod
    def from_config(cls, config: ModelConfig, *, cross: bool = False) -> Block:
        """The block ``config`` describes (norm, placement, MLP kind); ``cross``: a decoder block."""
        # Built in the order they run, so a seed gives the same weights as before the blocks were shared.
        attn = attention_layer(config)
        # No rotation in cross-attention: a decoder position and an encoder position share no axis.
        cross_attn = attention_layer(config, rotary=False) if cross else None
        if config.attn_only:
            mlp = None
        elif config.gated_mlp:
            mlp = GatedMLP(config.d_model, config.d_mlp, config.act_fn)
        else:
            mlp = MLP(config.d_model, config.d_mlp, config.dropout, config.act_fn)
        return cls(attn, mlp, lambda: norm_layer(config), cross_attn=cross_attn, post_norm=config.post_norm,
                   dropout=config.dropout)

    def _add(self, x: Tensor, added: Tensor, norm: nn.Module, out_hook: HookPoint, resid_hook: HookPoint) -> Tensor:
        """The end of one residual branch: ``x + added``, then the norm if post-norm."""
        x = resid_hook(x + out_hook(F.dropout(added, self.dropout, self.training)))
        return norm(x) if self.post_norm else x

    def forward(
        self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None,
        memory: Tensor | None = None, memory_padding_mask: Tensor | None = None, cross_kv_cache: KVCache | None = None,
    ) -> Tensor:
        """``x [B, T, D]`` -> ``[B, T, D]``; a decoder block also reads the encoder's output ``memory [B, S, D]``,
        whose projected keys/values ``cross_kv_cache`` keeps after the first call (see MultiHeadAttention)."""
        post = self.post_norm
        resid = iter(self._resid_points)  # the residual points after each branch, in order
        x = self.hook_resid_pre(x)
        attended, _ = self.attn(x if post else self.ln_attn(x), is_causal=causal, key_padding_mask=key_padding_mask,
                                kv_cache=kv_cache, need_weights=False)
        x = self._add(x, attended, self.ln_attn, self.hook_attn_out, next(resid))
        if self.has_cross:
            if memory is None:
                raise ValueError("a decoder block (with cross-attention) needs memory=, the encoder's output [B, S, D]")
            # Queries come from the decoder, keys and values from the encoder's output.
            attended, _ = self.cross_attn(x if post else self.ln_cross(x), memory, memory,
                                          key_padding_mask=memory_padding_mask, kv_cache=cross_kv_cache,
                                          need_weights=False)
            x = self._add(x, attended, self.ln_cross, self.hook_cross_attn_out, next(resid))
        if self.has_mlp:
            x = self._add(x, self.mlp(x if post else self.ln_mlp(x)), self.ln_mlp, self.hook_mlp_out, next(resid))
        return x
