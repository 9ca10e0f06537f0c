"""Exercises of notebook 01 (one head): write attention, then aim a query at a key."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .core import Exercise, Wrong, register


def _tensor(result, what: str, case: str) -> Tensor:
    if not isinstance(result, Tensor):
        raise Wrong(f"{what} should return a torch.Tensor, got {type(result).__name__} for {case}")
    if not result.is_floating_point():
        raise Wrong(f"{what} should return floating-point numbers, got dtype {result.dtype} for {case}")
    return result


# ------------------------------------------------------------------------------------ exercise 1
def _attention_reference(Q, K, V):
    d_k = Q.size(-1)
    weights = (Q @ K.transpose(-2, -1) / math.sqrt(d_k)).softmax(dim=-1)  # [..., L, S]
    return weights @ V  # [..., L, dv]


def _attention_cases():
    g = torch.Generator().manual_seed(1)
    shapes = [((3, 4), (5, 4), (5, 2)), ((6, 16), (6, 16), (6, 16)), ((2, 4, 8), (2, 7, 8), (2, 7, 3)), ((1, 9), (4, 9), (4, 6))]
    return [tuple(torch.randn(s, generator=g) * 1.5 for s in shape) for shape in shapes]


def _check_attention(attention) -> None:
    for Q, K, V in _attention_cases():
        case = f"Q {list(Q.shape)}, K {list(K.shape)}, V {list(V.shape)}"
        got = _tensor(attention(Q.clone(), K.clone(), V.clone()), "attention", case)
        want = _attention_reference(Q, K, V)
        if tuple(got.shape) != tuple(want.shape):
            if tuple(got.shape) == tuple(Q.shape[:-1]) + (K.size(-2),):
                raise Wrong(f"for {case} you returned shape {list(got.shape)}: that is the [L, S] matrix of weights. "
                            f"Attention returns each query's weighted sum of the values: [L, d_v] = {list(want.shape)}")
            raise Wrong(f"for {case} expected shape [..., L, d_v] = {list(want.shape)}, got {list(got.shape)}")
        if torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            continue
        scores = Q @ K.transpose(-2, -1)
        d_k = Q.size(-1)
        variants = {
            "the scores are not scaled: divide Q Kᵀ by sqrt(d_k) before the softmax": scores.softmax(-1) @ V,
            "the scores are divided by d_k; the scale is 1 / sqrt(d_k)": (scores / d_k).softmax(-1) @ V,
            "the softmax runs over the queries; each query's weights must sum to 1 over the keys (the last axis)":
                (scores / math.sqrt(d_k)).softmax(-2) @ V,
        }
        for message, wrong in variants.items():
            if tuple(wrong.shape) == tuple(got.shape) and torch.allclose(got, wrong, atol=1e-5, rtol=1e-4):
                raise Wrong(f"for {case}: {message}")
        diff = (got - want).abs().max().item()
        raise Wrong(f"for {case} your output differs from softmax(Q Kᵀ / sqrt(d_k)) V by up to {diff:.3g}")


register(Exercise(
    "01", 1, "attention from scratch",
    _check_attention,
    hint=["Three steps: scores = Q Kᵀ / sqrt(d_k); weights = softmax of the scores over the keys; output = weights V.",
          "Use K.transpose(-2, -1) so it also works with a batch axis in front, and Q.size(-1) for d_k."],
    solution=(
        "def attention(Q, K, V):\n"
        "    d_k = Q.size(-1)\n"
        "    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)   # [..., L, S]\n"
        "    weights = scores.softmax(dim=-1)                     # each query's weights sum to 1 over the keys\n"
        "    return weights @ V                                   # [..., L, d_v]"
    ),
    reference=_attention_reference,
    wrong=[
        lambda Q, K, V: (Q @ K.transpose(-2, -1)).softmax(-1) @ V,  # no scaling
        lambda Q, K, V: (Q @ K.transpose(-2, -1) / Q.size(-1)).softmax(-1) @ V,  # divided by d_k
        lambda Q, K, V: (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-2) @ V,  # wrong axis
        lambda Q, K, V: (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-1),  # the weights
    ],
))


# ------------------------------------------------------------------------------------ exercise 2
# (n_keys, d_k, j, weight): orthonormal keys, so every other key scores exactly 0.
_AIM_CASES = [(5, 8, 2, 0.9), (10, 16, 0, 0.5), (3, 3, 1, 0.6), (6, 64, 5, 0.99), (2, 4, 1, 0.75)]


def _orthonormal_keys(n_keys: int, d_k: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d_k, d_k, generator=g, dtype=torch.float64))
    return q[:n_keys].float()  # [S, d_k]: orthonormal rows


def _aim_reference(K, j, weight):
    S, d_k = K.shape
    gap = math.log(weight * (S - 1) / (1 - weight))  # score of key j minus the others' (0) after scaling
    return K[j] * gap * math.sqrt(d_k)  # K[j] . K[j] = 1, K[i] . K[j] = 0


def _check_aim(query_towards) -> None:
    for seed, (S, d_k, j, weight) in enumerate(_AIM_CASES):
        K = _orthonormal_keys(S, d_k, seed)
        case = f"{S} orthonormal keys of width d_k={d_k}, key j={j}, weight={weight}"
        q = _tensor(query_towards(K.clone(), j, weight), "query_towards", case)
        if tuple(q.shape) != (d_k,):
            raise Wrong(f"for {case} return one query vector of shape [d_k] = [{d_k}], got {list(q.shape)}")
        got = (K @ q.float() / math.sqrt(d_k)).softmax(-1)  # [S]: the weights this query gives
        if abs(got[j].item() - weight) <= 0.01:
            continue
        unscaled = (K @ q.float()).softmax(-1)[j].item()
        if abs(unscaled - weight) <= 0.01:
            raise Wrong(f"for {case} key j gets {got[j].item():.3f}: your query would be right without the "
                        "1/sqrt(d_k) scaling of the scores, but attention divides them by sqrt(d_k)")
        scores = K @ q.float() / math.sqrt(d_k)  # [S], after scaling
        others = torch.cat([scores[:j], scores[j + 1:]])
        if S > 2 and abs((scores[j] - others.max()).item() - math.log(weight / (1 - weight))) < 1e-3:
            raise Wrong(f"for {case} key j gets {got[j].item():.3f}: your score gap would give {weight} against "
                        f"one other key, but the other {S - 1} keys share the rest of the weight")
        raise Wrong(f"for {case} the query puts {got[j].item():.3f} on key j, not {weight} (±0.01)")


register(Exercise(
    "01", 2, "aim a query",
    _check_aim,
    hint=["The keys are orthonormal: a query c · K[j] scores c on key j and 0 on every other key, before the "
          "scaling by 1/sqrt(d_k).",
          "With score gap g (after scaling), key j gets e^g / (e^g + S - 1). Solve that for g, then undo the scaling."],
    solution=(
        "def query_towards(K, j, weight):\n"
        "    S, d_k = K.shape\n"
        "    gap = math.log(weight * (S - 1) / (1 - weight))   # scaled score of key j over the others (0)\n"
        "    return K[j] * gap * math.sqrt(d_k)                 # undo the 1/sqrt(d_k) scaling"
    ),
    reference=_aim_reference,
    wrong=[
        lambda K, j, weight: K[j] * math.log(weight * (K.size(0) - 1) / (1 - weight)),  # forgot the scale
        lambda K, j, weight: K[j] * math.log(weight / (1 - weight)) * math.sqrt(K.size(1)),  # forgot the other keys
        lambda K, j, weight: K[j] * weight,  # the weight is not a score
    ],
))
