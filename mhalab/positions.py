"""Where positions come from: a fixed sinusoidal table added to the embeddings, or rotary
position embedding applied to queries and keys."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["apply_rotary", "rotary_tables", "sinusoidal_positions"]


# (base, d_head, device, dtype) -> (cos, sin), each [n_positions, d_head]; grown on demand, never at import.
_ROTARY_TABLES: dict[tuple[float, int, torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}


def rotary_tables(length: int, d_head: int, base: float, device: torch.device | str,
                  dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin of every rotation angle for positions ``0 .. length - 1``, two ``[length, d_head]`` tensors,
    laid out for :func:`apply_rotary`: pair i's angle at features 2i and 2i + 1, the sine negated at 2i.

    Computed once per ``(base, d_head, device, dtype)`` and kept, grown (doubling) when a longer sequence
    comes: a 30-layer model decoding one token reads them 60 times.
    """
    key = (float(base), d_head, torch.device(device), dtype)
    tables = _ROTARY_TABLES.get(key)
    if tables is None or tables[0].size(0) < length:
        size = max(length, 64 if tables is None else 2 * tables[0].size(0))
        inv_freq = base ** (-torch.arange(0, d_head, 2, device=device, dtype=dtype) / d_head)  # [dk/2]
        angles = torch.arange(size, device=device, dtype=dtype)[:, None] * inv_freq[None, :]  # [size, dk/2]
        cos = angles.cos().repeat_interleave(2, dim=-1)  # [size, dk]: (cos a_i, cos a_i) for each pair
        sin = torch.stack((-angles.sin(), angles.sin()), dim=-1).flatten(-2)  # [size, dk]: (-sin a_i, sin a_i)
        tables = _ROTARY_TABLES[key] = (cos, sin)
    return tables


def apply_rotary(x: Tensor, positions: Tensor | int, base: float) -> Tensor:
    """Rotary position embedding (Su et al. 2021) on ``x [..., T, dk]`` at ``positions [T]`` (or ``start``,
    an int: positions ``start .. start + T - 1``, read from the table without a gather).

    Each adjacent pair of features ``(2i, 2i+1)`` turns by ``position * base ** (-2i / dk)``, so a
    query-key dot product depends only on their distance. (Hugging Face's Llama rotates halves
    ``(i, i + dk/2)``; GGUF files store Q and K rows permuted for adjacent pairs, as here.)
    """
    T, dk = x.size(-2), x.size(-1)
    dtype = torch.promote_types(x.dtype, torch.float32)  # half precision turns in float32; float64 stays exact
    if isinstance(positions, int):
        tables = rotary_tables(positions + T, dk, base, x.device, dtype)
        cos, sin = (t[positions : positions + T] for t in tables)  # [T, dk]
    else:
        positions = positions.to(device=x.device, dtype=torch.long)
        longest = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = (t[positions] for t in rotary_tables(longest, dk, base, x.device, dtype))  # [T, dk]
    wide = x.to(dtype)
    swapped = wide.unflatten(-1, (dk // 2, 2)).flip(-1).flatten(-2)  # [..., T, dk]: (x_2i+1, x_2i) for each pair
    # (x_2i, x_2i+1) -> (x_2i cos - x_2i+1 sin, x_2i+1 cos + x_2i sin): each pair turned by its angle
    return (wide * cos + swapped * sin).to(x.dtype)


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """The fixed table of "Attention Is All You Need", ``[max_len, d_model]``: sin on even, cos on odd features."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # [max_len, 1]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # [ceil(D/2)]
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d_model // 2])  # odd D has one cosine fewer
    return table
