"""Head scores: one number per head for how its attention is spread.

Every score takes attention as ``[layer][B, H, T, S]`` (one ``[B, H, T, S]`` tensor per layer, e.g.
``list(cache.values())``), a cache dict of such patterns from :func:`mhalab.hooks.run_with_cache`, or one
stacked ``[N, B, H, T, S]`` tensor, and returns ``[N, H]``: averaged over the batch and the query
positions where it is defined::

    _, cache = run_with_cache(model.eval(), batch.inputs, names="*.pattern")
    scores = head_scores(cache, batch)        # {"left1": [N, H], ..., "previous-token": [N, H], ...}

* :func:`relation_score`: how much attention lands where a ground-truth relation points (``batch.sources``);
* scores that need no ground truth: previous-token, next-token, self, first-token (an "attention sink"),
  entropy and mean attention distance.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import torch
from torch import Tensor

__all__ = [
    "GENERIC_SCORES",
    "FRACTION_SCORES",
    "stack_attention",
    "relation_score",
    "previous_token_score",
    "next_token_score",
    "self_score",
    "first_token_score",
    "attention_entropy",
    "attention_distance",
    "head_scores",
    "format_scores",
    "best_heads",
    "heads_matching",
    "NO_ROLE",
    "role_of",
]

Head = tuple[int, int]  # (layer, head)
Attention = Union[Sequence[Tensor], Mapping[str, Tensor], Tensor]

#: Scores that need no ground truth, in the order :func:`head_scores` returns them.
GENERIC_SCORES = ("previous-token", "next-token", "self", "first-token", "entropy", "distance")
#: Scores that are fractions of attention in [0, 1] (entropy is in nats, distance in positions).
FRACTION_SCORES = ("previous-token", "next-token", "self", "first-token")

#: The course's one vocabulary for what a head does, used by the explorer, the head grid and the exercises
#: (see :func:`role_of`): a task relation's name (``"left1"``) when the head follows that relation; else a
#: generic score's name (``"previous-token"``, ``"next-token"``, ``"self"``, ``"first-token"``); else
#: ``NO_ROLE``. A relation wins over a generic score: on these tasks ``left1`` *is* the previous token, and
#: the task's name says more. (:func:`heads_matching` returns Python's ``None`` for ``NO_ROLE``.)
NO_ROLE = "none"


def stack_attention(attention: Attention) -> Tensor:
    """``[layer][B, H, T, S]`` (or a cache dict of patterns) -> one ``[N, B, H, T, S]`` tensor.

    A stacked tensor is returned as is.
    """
    if isinstance(attention, Mapping):
        attention = list(attention.values())
    if isinstance(attention, Tensor):
        if attention.dim() != 5:
            raise ValueError(f"stacked attention must be [layer, batch, head, query, key], got shape {tuple(attention.shape)}")
        return attention
    shapes = {tuple(a.shape) for a in attention}
    if len(shapes) != 1:
        raise ValueError(f"cannot stack layers whose attention has different shapes {sorted(shapes)}")
    if len(next(iter(shapes))) != 4:
        raise ValueError(f"each layer's attention must be [batch, head, query, key], got shape {next(iter(shapes))}")
    return torch.stack(list(attention), dim=0)  # [N, B, H, T, S]


def _diagonal_score(attention: Attention, offset: int) -> Tensor:
    A = stack_attention(attention)
    diag = torch.diagonal(A, offset=offset, dim1=-2, dim2=-1)  # [N, B, H, T - |offset|]: A[q, q + offset]
    if diag.size(-1) == 0:
        raise ValueError(f"sequences of length {A.size(-1)} have no pairs at offset {offset}")
    return diag.float().mean(dim=(1, 3))  # [N, H]


def previous_token_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention from each query to the token just before it (queries 1..T-1)."""
    return _diagonal_score(attention, -1)


def next_token_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention from each query to the token just after it (queries 0..T-2)."""
    return _diagonal_score(attention, 1)


def self_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention from each query to itself."""
    return _diagonal_score(attention, 0)


def first_token_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention on position 0 (an "attention sink"), over queries 1..T-1.

    Query 0 is left out: it attends to position 0 as itself (and must, under a causal mask).
    """
    A = stack_attention(attention)
    if A.size(-2) < 2:
        raise ValueError("the first-token score needs at least two query positions")
    return A[..., 1:, 0].float().mean(dim=(1, 3))  # [N, B, H, T-1] -> [N, H]


def attention_entropy(attention: Attention) -> Tensor:
    """``[N, H]``: mean entropy of each query's weighting, in nats.

    0 means every query looks at exactly one key; ``log S`` means it spreads evenly over all S keys.
    """
    A = stack_attention(attention).float()
    plogp = torch.where(A > 0, A * A.clamp_min(1e-30).log(), torch.zeros_like(A))  # 0 log 0 = 0
    return -plogp.sum(dim=-1).mean(dim=(1, 3))  # [N, B, H, T] -> [N, H]


def attention_distance(attention: Attention) -> Tensor:
    """``[N, H]``: mean |query - key| distance, weighted by attention (in positions)."""
    A = stack_attention(attention).float()
    T, S = A.shape[-2:]
    offset = S - T  # queries are the last T of S positions (as with a KV cache); 0 for self-attention
    q = torch.arange(T, device=A.device)[:, None] + offset
    k = torch.arange(S, device=A.device)[None, :]
    distance = (q - k).abs().float()  # [T, S]
    return (A * distance).sum(dim=-1).mean(dim=(1, 3))  # [N, B, H, T] -> [N, H]


def relation_score(attention: Attention, sources: Tensor, *, name: str = "relation") -> Tensor:
    """``[N, H]``: mean attention each head puts on the position a relation points to.

    Args:
        attention: ``[layer][B, H, T, S]`` or ``[N, B, H, T, S]``.
        sources: ``[B, T]`` long: for each query, the key position the relation points to, ``-1``
            where it points nowhere (those queries are left out of the mean).

    A head scoring 0.9 puts, on average, 90% of its attention exactly where the relation points.
    """
    A = stack_attention(attention)
    N, B, H, T, S = A.shape
    if tuple(sources.shape) != (B, T):
        raise ValueError(
            f"sources for {name!r} must be [batch, query] = [{B}, {T}] to match the attention, got {tuple(sources.shape)}"
        )
    sources = sources.to(A.device)
    valid = sources >= 0  # [B, T]
    if not bool(valid.any()):
        raise ValueError(f"relation {name!r} points nowhere in this batch (all sources are -1), so it cannot be scored")
    if int(sources.max()) >= S:
        raise ValueError(f"relation {name!r} points to position {int(sources.max())}, but there are only {S} keys")
    index = sources.clamp(min=0)[None, :, None, :, None].expand(N, B, H, T, 1)  # [N, B, H, T, 1]
    on_source = A.gather(-1, index).squeeze(-1).float()  # [N, B, H, T]: attention on the pointed-to key
    weight = valid[None, :, None, :].float()  # [1, B, 1, T]
    return (on_source * weight).sum(dim=(1, 3)) / weight.sum()  # [N, H]


def head_scores(
    attention: Attention,
    batch: Any = None,
    *,
    relations: Sequence[str] | None = None,
    generic: bool = True,
) -> dict[str, Tensor]:
    """Every score for every head: ``{name: [N, H]}``.

    Args:
        attention: ``[layer][B, H, T, S]``, a cache dict of patterns, or stacked.
        batch: the task ``Batch`` the attention was computed on; its ``sources`` give one score per
            relation (omit it for the generic scores only).
        relations: which relations to score, in this order (default: all of ``batch.sources``).
        generic: include the scores that need no ground truth (:data:`GENERIC_SCORES`).

    Returns:
        Relation scores first (fraction of attention on the right position, in [0, 1]), then
        ``previous-token``, ``next-token``, ``self``, ``first-token`` (fractions), ``entropy`` (nats)
        and ``distance`` (positions).
    """
    A = stack_attention(attention)
    scores: dict[str, Tensor] = {}
    if batch is not None:
        sources = getattr(batch, "sources", None)
        if sources is None:
            raise TypeError(f"batch must be a task Batch with .sources, got {type(batch).__name__}")
        names = list(sources) if relations is None else list(relations)
        for name in names:
            if name not in sources:
                raise KeyError(f"relation {name!r} is not in this batch; it has {sorted(sources)}")
            scores[name] = relation_score(A, sources[name], name=name)
    elif relations:
        raise ValueError("relation scores need the batch (with .sources) the attention was computed on")
    if generic:
        scores["previous-token"] = previous_token_score(A)
        scores["next-token"] = next_token_score(A)
        scores["self"] = self_score(A)
        scores["first-token"] = first_token_score(A)
        scores["entropy"] = attention_entropy(A)
        scores["distance"] = attention_distance(A)
    return scores


def format_scores(scores: dict[str, Tensor], *, names: Sequence[str] | None = None, digits: int = 2) -> str:
    """A text table: one row per head (``L0H3``), one column per score."""
    names = list(scores) if names is None else list(names)
    N, H = next(iter(scores.values())).shape
    width = max(6, *(len(n) for n in names))
    lines = ["head  " + " ".join(f"{n:>{width}}" for n in names)]
    for layer in range(N):
        for head in range(H):
            row = " ".join(f"{float(scores[n][layer, head]):>{width}.{digits}f}" for n in names)
            lines.append(f"L{layer}H{head}  {row}")
    return "\n".join(lines)


def best_heads(scores: dict[str, Tensor], names: Sequence[str]) -> dict[str, tuple[Head, float]]:
    """For each score name: the head with the highest score and that score, ``{name: ((layer, head), score)}``."""
    out = {}
    for name in names:
        s = scores[name]
        flat = int(s.argmax())
        layer, head = divmod(flat, s.size(1))
        out[name] = ((layer, head), float(s[layer, head]))
    return out


def heads_matching(scores: dict[str, Tensor], names: Sequence[str], threshold: float = 0.8) -> dict[Head, str | None]:
    """Each head's best-matching name among ``names`` if its score reaches ``threshold``, else None."""
    stacked = torch.stack([scores[n] for n in names], dim=0)  # [R, N, H]
    value, which = stacked.max(dim=0)  # [N, H]
    N, H = value.shape
    return {(l, h): (names[int(which[l, h])] if float(value[l, h]) >= threshold else None) for l in range(N) for h in range(H)}


def role_of(scores: Mapping[str, Any], layer: int, head: int, relations: Sequence[str] = (), threshold: float = 0.5) -> str:
    """The head's role in the course's one vocabulary (see :data:`NO_ROLE`).

    The relation of ``relations`` with the highest score if it is at least ``threshold``; else the generic
    fraction score (:data:`FRACTION_SCORES`) with the highest score if at least ``threshold``; else ``NO_ROLE``.
    ``scores`` maps names to ``[N, H]`` (tensors or arrays), as :func:`head_scores` returns.
    """
    for names in (list(relations), [n for n in FRACTION_SCORES if n in scores]):
        best, value = None, threshold
        for name in names:
            v = float(scores[name][layer][head])
            if v >= value:
                best, value = name, v
        if best is not None:
            return best
    return NO_ROLE
