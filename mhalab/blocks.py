"""The parts every model here is built from: one :class:`Block` (pre- or post-norm, :class:`LayerNorm`,
:class:`RMSNorm` or none, :class:`MLP`, :class:`GatedMLP` or none, optional cross-attention), each made from a
:class:`ModelConfig` by :meth:`Block.from_config`, with TransformerLens's names for its parts (``ln1``, ``attn``,
``ln2``, ``mlp``) and their hook points. Shapes: B batch, T length, S source length, D d_model, F d_mlp.
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

__all__ = ["activation", "MLP", "GatedMLP", "LayerNorm", "RMSNorm", "norm_layer", "attention_layer", "Block"]


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"), "relu": F.relu, "silu": F.silu,
}


def activation(act_fn: str) -> Callable[[Tensor], Tensor]:
    """The function TransformerLens calls ``act_fn`` (``"gelu"``, ``"gelu_new"``, ``"relu"``, ``"silu"``)."""
    if act_fn not in _ACTIVATIONS:
        raise ValueError(f"act_fn must be one of {tuple(_ACTIVATIONS)}, got {act_fn!r}")
    return _ACTIVATIONS[act_fn]


class MLP(nn.Module):
    """Position-wise feed-forward network: ``[B, T, D] -> [B, T, F] -> [B, T, D]``, GELU unless ``act_fn``. Hook
    points as TransformerLens's: ``hook_pre`` (``fc_in``'s output) and ``hook_post`` (after the activation),
    both ``[B, T, F]``."""

    def __init__(self, d_model: int, d_mlp: int, dropout: float = 0.0, act_fn: str = "gelu") -> None:
        super().__init__()
        self.act = activation(act_fn)
        self.fc_in = nn.Linear(d_model, d_mlp)
        self.hook_pre = HookPoint()  # [B, T, F]
        self.hook_post = HookPoint()  # [B, T, F]
        self.fc_out = nn.Linear(d_mlp, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        post = self.hook_post(self.act(self.hook_pre(self.fc_in(x))))  # [B, T, F]
        return F.dropout(self.fc_out(post), self.dropout, self.training)


class GatedMLP(nn.Module):
    """Gated feed-forward network, SwiGLU with ``act_fn="silu"`` (Shazeer 2020; Llama): ``down(act(gate(x)) * up(x))``,
    no biases, ``[B, T, D] -> [B, T, F] -> [B, T, D]``. Hook points as TransformerLens's gated MLP: ``hook_pre``
    (``gate(x)``, before the activation), ``hook_pre_linear`` (``up(x)``), ``hook_post`` (their product after the
    activation), each ``[B, T, F]``."""

    def __init__(self, d_model: int, d_mlp: int, act_fn: str = "silu") -> None:
        super().__init__()
        self.act = activation(act_fn)
        self.gate = nn.Linear(d_model, d_mlp, bias=False)
        self.up = nn.Linear(d_model, d_mlp, bias=False)
        self.hook_pre = HookPoint()  # [B, T, F]
        self.hook_pre_linear = HookPoint()  # [B, T, F]
        self.hook_post = HookPoint()  # [B, T, F]
        self.down = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        post = self.act(self.hook_pre(self.gate(x))) * self.hook_pre_linear(self.up(x))  # [B, T, F]
        return self.down(self.hook_post(post))


def _norm_hooked(norm: nn.Module) -> bool:
    return norm.hook_scale.is_hooked or norm.hook_normalized.is_hooked


class LayerNorm(nn.LayerNorm):
    """torch's ``nn.LayerNorm`` with TransformerLens's hook points: ``hook_scale`` ``[..., 1]`` (what the centred
    input is divided by, ``sqrt(var + eps)``) and ``hook_normalized`` ``[..., D]`` (before the weight and bias).
    Unhooked it is torch's fused kernel; hooked, the same steps written out (equal up to float rounding)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)
        self.hook_scale = HookPoint()  # [..., 1]
        self.hook_normalized = HookPoint()  # [..., D]

    def forward(self, x: Tensor) -> Tensor:
        if not _norm_hooked(self):
            return super().forward(x)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())  # [..., 1]
        return self.hook_normalized(x / scale) * self.weight + self.bias


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (no centring, no bias), in float32 or wider; hook
    points ``hook_scale`` ``[..., 1]`` (``sqrt(mean(x^2) + eps)``) and ``hook_normalized`` ``[..., D]`` (before
    the weight), as TransformerLens's (hooked, a division replaces the reciprocal square root: float rounding)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.hook_scale = HookPoint()  # [..., 1]
        self.hook_normalized = HookPoint()  # [..., D]

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # half precision in float32; float64 stays
        if _norm_hooked(self):
            normed = self.hook_normalized(x32 / self.hook_scale((x32.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()))
        else:
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def norm_layer(config: ModelConfig) -> nn.Module:
    """The norm ``config.normalization_type`` names: :class:`LayerNorm` ("LN"), :class:`RMSNorm` ("RMS"), or
    ``nn.Identity`` (None: no norm, as TransformerLens builds it)."""
    if config.normalization_type == "RMS":
        return RMSNorm(config.d_model, config.eps)
    if config.normalization_type is None:
        return nn.Identity()
    return LayerNorm(config.d_model, eps=config.eps)


def attention_layer(config: ModelConfig, *, rotary: bool | None = None) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` of ``config``'s shape (rotary if ``positional_embedding_type="rotary"``, or as
    ``rotary`` says)."""
    rotary = config.positional_embedding_type == "rotary" if rotary is None else rotary
    attn = MultiHeadAttention(
        config.d_model, config.n_heads, n_key_value_heads=config.n_key_value_heads, d_head=config.d_head,
        bias=config.bias, dropout=config.dropout, rotary_base=config.rotary_base if rotary else None,
    )
    attn.use_attn_result = config.use_attn_result
    return attn


class Block(nn.Module):
    """One transformer block, as every model here builds it: self-attention, optionally cross-attention to
    an encoder's output, optionally an MLP, each on a residual branch.

    Pre-norm (GPT-2, Llama; the toy models): ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``, stable without
    warm-up. Post-norm (the 2017 paper, BERT): ``ln1(x + attn(x))``, then ``ln2(x + mlp(x))``. ``norm`` makes
    the norm layers (:class:`LayerNorm`, :class:`RMSNorm`, ``nn.Identity``), ``mlp`` is :class:`MLP`,
    :class:`GatedMLP` or None (attention-only). The norms are numbered in the order they run, as TransformerLens
    numbers them: ``ln1`` (attention), ``ln2`` (the MLP's; in a decoder block the cross-attention's), ``ln3`` (a
    decoder block's MLP), where those sublayers exist. Hook points (axes in
    :mod:`mhalab.hooks`): ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid`` (when a sublayer follows the
    attention), ``hook_cross_attn_out`` and ``hook_resid_mid_cross`` (decoder blocks; the latter before an MLP),
    ``hook_mlp_out``, ``hook_resid_post``; the norms' ``hook_scale``, ``hook_normalized`` and the MLP's
    ``hook_pre``, ``hook_post``. In a post-norm block the residual points are the sums before the norm, as in
    TransformerLens's BERT.
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
        self.ln1 = norm()
        self.attn = attn
        if not post_norm:  # what attn.W_Q, W_K, W_V fold in (a post-norm block's norm comes after the attention)
            attn.reads_through(self.ln1)
        self.hook_attn_out = HookPoint()  # [B, T, D]: what the attention adds to the stream
        if self.has_cross or self.has_mlp:
            self.hook_resid_mid = HookPoint()  # [B, T, D]
        if self.has_cross:
            self.ln2 = norm()
            self.cross_attn = cross_attn
            self.hook_cross_attn_out = HookPoint()  # [B, T, D]
            if self.has_mlp:
                self.hook_resid_mid_cross = HookPoint()  # [B, T, D]
        if self.has_mlp:
            setattr(self, "ln3" if self.has_cross else "ln2", norm())  # the third norm of a decoder block
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
        attended, _ = self.attn(x if post else self.ln1(x), is_causal=causal, key_padding_mask=key_padding_mask,
                                kv_cache=kv_cache, need_weights=False)
        x = self._add(x, attended, self.ln1, self.hook_attn_out, next(resid))
        if self.has_cross:
            if memory is None:
                raise ValueError("a decoder block (with cross-attention) needs memory=, the encoder's output [B, S, D]")
            # Queries come from the decoder, keys and values from the encoder's output.
            attended, _ = self.cross_attn(x if post else self.ln2(x), memory, memory,
                                          key_padding_mask=memory_padding_mask, kv_cache=cross_kv_cache,
                                          need_weights=False)
            x = self._add(x, attended, self.ln2, self.hook_cross_attn_out, next(resid))
        if self.has_mlp:
            norm = self.ln3 if self.has_cross else self.ln2
            x = self._add(x, self.mlp(x if post else norm(x)), norm, self.hook_mlp_out, next(resid))
        return x
