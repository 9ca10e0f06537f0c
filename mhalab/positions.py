"""Where positions come from: rotary position embedding applied to queries and keys."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply_rotary"]


def apply_rotary(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding (Su et al. 2021) on ``x [..., T, dk]`` at ``positions [T]``.

    Each adjacent pair of features ``(2i, 2i+1)`` is rotated by the angle
    ``position * base ** (-2i / dk)``: the dot product of a rotated query and key then
    depends on their positions only through their distance.  (Llama's Hugging Face
    checkpoints rotate the two halves ``(i, i + dk/2)`` instead; GGUF files store Q and K
    rows permuted so that adjacent pairs are right, which is the convention here.)
    """
    dk = x.size(-1)
    inv_freq = base ** (-torch.arange(0, dk, 2, device=x.device, dtype=torch.float32) / dk)  # [dk/2]
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, dk/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()  # [..., T, dk/2] each: the two halves of every pair
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # [..., T, dk/2, 2]
    return rotated.flatten(-2).to(x.dtype)  # [..., T, dk]: pairs back in place
