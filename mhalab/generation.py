"""Greedy decoding, for any model: :func:`generate_tokens` calls a step function that returns next-token logits,
appends the most likely token and stops after ``new_tokens`` or once every row has emitted a stop token. A model's
``generate`` (:class:`~mhalab.models.Transformer`, :class:`~mhalab.encoder_decoder.EncoderDecoder`) gives it a step
that reads its KV caches."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .arguments import validate_int

__all__ = ["generate_tokens"]


@torch.no_grad()
def generate_tokens(
    step: Callable[[Tensor], Tensor], prompt: Tensor, new_tokens: int, *, cached: bool = True,
    stop: Sequence[int] = (),
) -> Tensor:
    """Greedy decoding: ``prompt [B, T0]`` -> ``[B, T0 + new_tokens]``.

    ``step(ids)`` returns logits ``[B, t, V]``; with ``cached`` it is fed only the newest token (the
    model keeps the others' keys and values in its KV caches), else the whole sequence so far.
    ``stop``: token ids that end a row (an end-of-turn token); a row that has emitted one repeats it, and
    decoding ends as soon as every row has, so the result can be shorter: ``[B, T0 + n]``, ``n <= new_tokens``.
    """
    validate_int("new_tokens", new_tokens, 0)
    stop = [validate_int("a stop token id", t, 0) for t in ([stop] if isinstance(stop, int) else stop)]
    stop_ids = torch.tensor(stop, dtype=prompt.dtype, device=prompt.device) if stop else None  # [S]
    done = torch.zeros(prompt.size(0), 1, dtype=torch.bool, device=prompt.device)  # [B, 1]: row has stopped
    tokens = step_input = prompt
    for _ in range(new_tokens):
        next_token = step(step_input)[:, -1].argmax(-1, keepdim=True)  # [B, 1]: the most likely next token
        if stop_ids is not None:
            next_token = torch.where(done, tokens[:, -1:], next_token)  # a stopped row repeats its stop token
            done = done | (next_token == stop_ids).any(-1, keepdim=True)  # [B, 1] == [S] -> [B, S] -> [B, 1]
        tokens = torch.cat([tokens, next_token], dim=1)  # [B, t + 1]
        if stop_ids is not None and bool(done.all()):  # (one host sync per step, only with stop tokens)
            break
        step_input = next_token if cached else tokens
    return tokens
