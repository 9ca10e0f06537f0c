"""Where positions come from: a fixed sinusoidal table added to the embeddings, or rotary
position embedding applied to queries and keys."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["apply_rotary", "sinusoidal_positions"]


def apply_rotary(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding (Su et al. 2021) on ``x [..., T, dk]`` at ``positions [T]``.

    Each adjacent pair of features ``(2i, 2i+1)`` turns by ``position * base ** (-2i / dk)``, so a
    query-key dot product depends only on their distance. (Hugging Face's Llama rotates halves
    ``(i, i + dk/2)``; GGUF files store Q and K rows permuted for adjacent pairs, as here.)
    """
    dk = x.size(-1)
    dtype = torch.promote_types(x.dtype, torch.float32)  # half precision turns in float32; float64 stays exact
    inv_freq = base ** (-torch.arange(0, dk, 2, device=x.device, dtype=dtype) / dk)  # [dk/2]
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]  # [T, dk/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2].to(dtype), x[..., 1::2].to(dtype)  # [..., T, dk/2] each: the two halves of every pair
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # [..., T, dk/2, 2]
    return rotated.flatten(-2).to(x.dtype)  # [..., T, dk]: pairs back in place


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """The fixed table of "Attention Is All You Need", ``[max_len, d_model]``: sin on even, cos on odd features."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # [max_len, 1]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # [ceil(D/2)]
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d_model // 2])  # odd D has one cosine fewer
    return table
