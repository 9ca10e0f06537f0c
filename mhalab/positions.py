"""Where positions come from: a fixed sinusoidal table added to the embeddings, or rotary
position embedding applied to queries and keys."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["apply_rotary", "rotary_tables", "sinusoidal_positions"]


# (base, d_head, device) -> (cos, sin), each [n_positions, d_head / 2] in float32; grown on demand, never at import.
_ROTARY_TABLES: dict[tuple[float, int, torch.device], tuple[Tensor, Tensor]] = {}


def rotary_tables(length: int, d_head: int, base: float, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """cos and sin of every rotation angle for positions ``0 .. length - 1``: two ``[length, d_head / 2]`` float32.

    Computed once per ``(base, d_head, device)`` and kept, grown (doubling) when a longer sequence comes:
    a 30-layer model decoding one token reads them 60 times.
    """
    key = (float(base), d_head, torch.device(device))
    tables = _ROTARY_TABLES.get(key)
    if tables is None or tables[0].size(0) < length:
        size = max(length, 64 if tables is None else 2 * tables[0].size(0))
        inv_freq = base ** (-torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)  # [dk/2]
        angles = torch.arange(size, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [size, dk/2]
        tables = _ROTARY_TABLES[key] = (angles.cos(), angles.sin())
    return tables


def apply_rotary(x: Tensor, positions: Tensor | int, base: float) -> Tensor:
    """Rotary position embedding (Su et al. 2021) on ``x [..., T, dk]`` at ``positions [T]`` (or ``start``,
    an int: positions ``start .. start + T - 1``, read from the table without a gather).

    Each adjacent pair of features ``(2i, 2i+1)`` turns by ``position * base ** (-2i / dk)``, so a
    query-key dot product depends only on their distance. (Hugging Face's Llama rotates halves
    ``(i, i + dk/2)``; GGUF files store Q and K rows permuted for adjacent pairs, as here.)
    """
    T, dk = x.size(-2), x.size(-1)
    if isinstance(positions, int):
        cos, sin = (t[positions : positions + T] for t in rotary_tables(positions + T, dk, base, x.device))  # [T, dk/2]
    else:
        positions = positions.to(device=x.device, dtype=torch.long)
        longest = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = (t[positions] for t in rotary_tables(longest, dk, base, x.device))  # [T, dk/2]
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()  # [..., T, dk/2] each: the two halves of every pair
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
