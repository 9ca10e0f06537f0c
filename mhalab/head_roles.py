"""Head scores: one number per head for how its attention is spread.

Every score takes attention as ``[layer][B, H, T, S]``, a cache of ``hook_pattern``
points from ``model.run_with_cache``, or one stacked ``[N, B, H, T, S]`` tensor, and returns ``[N, H]``:
averaged over the batch and the query positions where it is defined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FRACTION_SCORES", "GENERIC_SCORES", "NO_ROLE", "stack_attention", "relation_score", "fraction_keys",
    "previous_token_score", "induction_score", "self_score", "first_token_score", "attention_entropy",
    "attention_distance", "head_scores", "format_scores", "best_heads", "heads_matching", "role_of",
]

Head = tuple[int, int]  # (layer, head)
Attention = Sequence[Tensor] | Mapping[str, Tensor] | Tensor

#: Scores that need no ground truth and are fractions of attention in [0, 1]: each on one key per query.
FRACTION_SCORES = ("previous-token", "next-token", "self", "first-token")
#: All scores that need no ground truth, in :func:`head_scores`' order (entropy: nats, distance: positions).
GENERIC_SCORES = (*FRACTION_SCORES, "entropy", "distance")
#: The role of a head that follows nothing (see :func:`role_of`, the course's one vocabulary for roles).
NO_ROLE = "none"


def stack_attention(attention: Attention) -> Tensor:
    """``[layer][B, H, T, S]`` (or a cache dict of patterns) -> one ``[N, B, H, T, S]`` (a stack: as is)."""
    if isinstance(attention, Mapping):
        attention = list(attention.values())
    if isinstance(attention, Tensor):
        if attention.dim() != 5:
            raise ValueError("stacked attention must be [layer, batch, head, query, key], "
                             f"got shape {tuple(attention.shape)}")
        return attention
    shapes = {tuple(a.shape) for a in attention}
    if len(shapes) != 1:
        raise ValueError(f"cannot stack layers whose attention has different shapes {sorted(shapes)}")
    if len(next(iter(shapes))) != 4:
        raise ValueError(f"each layer's attention must be [batch, head, query, key], got shape {next(iter(shapes))}")
    return torch.stack(list(attention), dim=0)  # [N, B, H, T, S]


def fraction_keys(name: str, T: int, S: int) -> Tensor:
    """``[T]``: the key each query looks at for :data:`FRACTION_SCORES` score ``name`` (-1: query left out)."""
    q = torch.arange(T)
    first = torch.where(q > 0, 0, -1)  # query 0 is left out: it is position 0 itself
    keys = {"previous-token": q - 1, "next-token": q + 1, "self": q, "first-token": first}[name]
    return torch.where(keys < S, keys, -1)


def _fraction_score(attention: Attention, name: str) -> Tensor:
    A = stack_attention(attention)
    N, B, H, T, S = A.shape
    return relation_score(A, fraction_keys(name, T, S).expand(B, T), name=name)  # a relation with fixed keys


def previous_token_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention from each query to the token just before it (queries 1..T-1)."""
    return _fraction_score(attention, "previous-token")


def induction_score(attention: Attention, tokens: Tensor) -> Tensor:
    """``[N, H]``: mean attention from each query to the tokens that *followed* earlier occurrences of its
    own token (Olsson et al. 2022's prefix matching), over the queries whose token occurred before.

    ``tokens`` ``[B, T]``: the ids the attention was computed on (self-attention, ``T`` queries and keys).
    Key ``j`` counts for query ``i`` when ``tokens[j - 1] == tokens[i]`` and ``j < i`` (``j = i`` would be
    the query itself). On a random sequence repeated twice, an induction head scores near 1.
    """
    A = stack_attention(attention)
    N, B, H, T, S = A.shape
    if not isinstance(tokens, Tensor) or tuple(tokens.shape) != (B, T) or T != S:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"induction_score needs self-attention over the tokens it was computed on: tokens "
                         f"[batch, pos] = [{B}, {T}] for attention of {T} queries and {S} keys, got tokens {got}")
    tokens = tokens.to(A.device)
    follows = torch.zeros(B, T, S, dtype=torch.bool, device=A.device)  # [B, query, key]
    follows[:, :, 1:] = tokens[:, :, None] == tokens[:, None, :-1]  # key j's previous token is the query's token
    follows &= torch.ones(T, S, dtype=torch.bool, device=A.device).tril(-1)  # earlier keys only: j < i
    counted = follows.any(dim=-1)  # [B, T]: queries whose token occurred before (with a follower)
    if not bool(counted.any()):
        raise ValueError("no token in these sequences occurs twice, so there is nothing to induce; score "
                         "induction on a sequence with repeats, e.g. random tokens followed by the same tokens")
    on_followers = (A.float() * follows[None, :, None]).sum(dim=-1)  # [N, B, H, T]
    weight = counted[None, :, None].float()  # [1, B, 1, T]
    return (on_followers * weight).sum(dim=(1, 3)) / weight.sum()  # [N, H]


def self_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention from each query to itself."""
    return _fraction_score(attention, "self")


def first_token_score(attention: Attention) -> Tensor:
    """``[N, H]``: mean attention on position 0 (an "attention sink") from queries 1..T-1."""
    return _fraction_score(attention, "first-token")


def attention_entropy(attention: Attention) -> Tensor:
    """``[N, H]``: mean entropy of each query's weighting in nats: 0 for one key, ``log S`` for all S evenly."""
    A = stack_attention(attention).float()
    return -torch.special.xlogy(A, A).sum(dim=-1).mean(dim=(1, 3))  # 0 log 0 = 0; [N, B, H, T] -> [N, H]


def attention_distance(attention: Attention) -> Tensor:
    """``[N, H]``: mean |query - key| distance, weighted by attention (in positions)."""
    A = stack_attention(attention).float()
    T, S = A.shape[-2:]
    q = torch.arange(S - T, S, device=A.device)  # queries are the last T of S positions (as with a KV cache)
    distance = (q[:, None] - torch.arange(S, device=A.device)).abs().float()  # [T, S]
    return (A * distance).sum(dim=-1).mean(dim=(1, 3))  # [N, B, H, T] -> [N, H]


def relation_score(attention: Attention, sources: Tensor, *, name: str = "relation") -> Tensor:
    """``[N, H]``: mean attention each head puts on the key a relation points to.

    ``sources`` ``[B, T]`` long: each query's key position, ``-1`` where it points nowhere (left out).
    """
    A = stack_attention(attention)
    N, B, H, T, S = A.shape
    if tuple(sources.shape) != (B, T):
        raise ValueError(
            f"sources for {name!r} must be [batch, query] = [{B}, {T}] to match the attention, "
            f"got {tuple(sources.shape)}"
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


def head_scores(attention: Attention, batch: Any = None, *, generic: bool = True) -> dict[str, Tensor]:
    """Every score for every head, ``{name: [N, H]}``: one per relation of ``batch.sources`` when a task
    ``batch`` is given, then (``generic``) those of :data:`GENERIC_SCORES`."""
    A = stack_attention(attention)
    scores: dict[str, Tensor] = {}
    if batch is not None:
        sources = getattr(batch, "sources", None)
        if sources is None:
            raise TypeError(f"batch must be a task Batch with .sources, got {type(batch).__name__}")
        scores = {name: relation_score(A, keys, name=name) for name, keys in sources.items()}
    if generic:
        scores.update({name: _fraction_score(A, name) for name in FRACTION_SCORES})
        scores.update(entropy=attention_entropy(A), distance=attention_distance(A))
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
    best = {name: divmod(int(scores[name].argmax()), scores[name].size(1)) for name in names}  # (layer, head)
    return {name: (head, float(scores[name][head])) for name, head in best.items()}


def heads_matching(scores: dict[str, Tensor], names: Sequence[str], threshold: float = 0.8) -> dict[Head, str | None]:
    """Each head's best-matching name among ``names`` if its score reaches ``threshold``, else None."""
    stacked = torch.stack([scores[n] for n in names], dim=0)  # [R, N, H]
    value, which = stacked.max(dim=0)  # [N, H]
    N, H = value.shape
    return {(l, h): (names[int(which[l, h])] if float(value[l, h]) >= threshold else None)
            for l in range(N) for h in range(H)}


def role_of(scores: Mapping[str, Any], layer: int, head: int, relations: Sequence[str] = (),
            threshold: float = 0.5) -> str:
    """The head's role, as the explorer, the head grid and the exercises name it: the best of ``relations``
    scoring at least ``threshold``, else the best such :data:`FRACTION_SCORES` name, else :data:`NO_ROLE`.
    A relation wins: on these tasks ``left1`` *is* the previous token, and says more."""
    for names in (list(relations), [n for n in FRACTION_SCORES if n in scores]):
        best = max(names, key=lambda name: float(scores[name][layer][head]), default=None)
        if best is not None and float(scores[best][layer][head]) >= threshold:
            return best
    return NO_ROLE
