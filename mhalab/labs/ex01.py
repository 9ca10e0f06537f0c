"""Exercises of notebook 01 (one head): write attention, then aim a query at a key."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, expect_shape, first_match
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _attention_cases(check: Check):
    g = check.generator(1)
    shapes = [
        ((3, 4), (5, 4), (5, 2)),
        ((6, 16), (6, 16), (6, 16)),
        ((2, 4, 8), (2, 7, 8), (2, 7, 3)),
        ((1, 9), (4, 9), (4, 6)),
    ]
    return [tuple(torch.randn(s, generator=g) * 1.5 for s in shape) for shape in shapes]


def _check_attention(attention, check: Check) -> None:
    for Q, K, V in _attention_cases(check):
        case = f"Q {list(Q.shape)}, K {list(K.shape)}, V {list(V.shape)}"
        got = as_float64(check.call(attention, Q, K, V, label=case), f"what attention({case}) returned")
        Q, K, V = Q.double(), K.double(), V.double()
        want = check.reference(Q, K, V)
        if tuple(got.shape) == tuple(Q.shape[:-1]) + (K.size(-2),) and got.shape != want.shape:
            raise Wrong(f"for {case} you returned shape {list(got.shape)}: that is the [L, S] matrix of weights. "
                        f"Attention returns each query's weighted sum of the values: [L, d_v] = {list(want.shape)}")
        expect_shape(got, want.shape, f"the result for {case}")
        scores, d_k = Q @ K.transpose(-2, -1), Q.size(-1)
        if first_match(got, {"": want}) is not None:
            continue
        mistake = first_match(got, {
            "the scores are not scaled: divide Q Kᵀ by sqrt(d_k) before the softmax": scores.softmax(-1) @ V,
            "the scores are divided by d_k; the scale is 1 / sqrt(d_k)": (scores / d_k).softmax(-1) @ V,
            "the softmax runs over the queries; each query's weights must sum to 1 over the keys (the last axis)":
                (scores / math.sqrt(d_k)).softmax(-2) @ V,
            "the scores are multiplied by sqrt(d_k); divide by it": (scores * math.sqrt(d_k)).softmax(-1) @ V,
            "the scale uses the number of keys; it is sqrt(d_k), the width of a query (Q.size(-1))":
                (scores / math.sqrt(K.size(-2))).softmax(-1) @ V,
            "the scale uses the width of the values; it is sqrt(d_k), the width of a query (Q.size(-1))":
                (scores / math.sqrt(V.size(-1))).softmax(-1) @ V,
            "the output is divided by sqrt(d_k) after the softmax; the scale goes on the scores, before it":
                scores.softmax(-1) @ V / math.sqrt(d_k),
            "the weights are a sigmoid of the scores; attention's weights are a softmax over the keys, so they sum to "
            "1":
                (scores / math.sqrt(d_k)).sigmoid() @ V,
            "the weights are log-probabilities (log_softmax); attention weighs the values by the softmax itself":
                (scores / math.sqrt(d_k)).log_softmax(-1) @ V,
            "each query's scores are divided by their sum; the softmax exponentiates them first (exp, then divide)":
                (lambda s: s / s.sum(-1, keepdim=True))(scores / math.sqrt(d_k)) @ V,
        })
        if mistake:
            raise Wrong(f"for {case}: {mistake}")
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
    minutes=10, difficulty=1, importance=5,
))


# ------------------------------------------------------------------------------------ exercise 2
# (n_keys, d_k, j, weight): orthonormal keys, so every other key scores exactly 0. Two weights are below
# 1/S, where key j must score *less* than the others.
_AIM_CASES = [
    (5, 8, 2, 0.9),
    (10, 16, 0, 0.5),
    (3, 3, 1, 0.6),
    (5, 8, 3, 0.1),
    (6, 64, 5, 0.99),
    (4, 4, 1, 0.05),
    (2, 4, 1, 0.75),
]


def _orthonormal_keys(check: Check, n_keys: int, d_k: int, seed: int) -> Tensor:
    g = check.generator(100 + seed)
    q, _ = torch.linalg.qr(torch.randn(d_k, d_k, generator=g, dtype=torch.float64))
    return q[:n_keys].float()  # [S, d_k]: orthonormal rows


def _check_aim(query_towards, check: Check) -> None:
    for seed, (S, d_k, j, weight) in enumerate(_AIM_CASES):
        K = _orthonormal_keys(check, S, d_k, seed)
        case = f"{S} orthonormal keys of width d_k={d_k}, key j={j}, weight={weight}"
        q = as_float64(check.call(query_towards, K, j, weight, label=case), f"the query for {case}")
        expect_shape(q, (d_k,), f"the query for {case} (one vector of width d_k)")
        K = K.double()
        scores = K @ q / math.sqrt(d_k)  # [S], after scaling
        got = scores.softmax(-1)  # [S]: the weights this query gives
        if abs(got[j].item() - weight) <= 0.01:
            continue
        if abs((K @ q).softmax(-1)[j].item() - weight) <= 0.01:
            raise Wrong(f"for {case} key j gets {got[j].item():.3f}: your query would be right without the "
                        "1/sqrt(d_k) scaling of the scores, but attention divides them by sqrt(d_k)")
        others = torch.cat([scores[:j], scores[j + 1:]])
        if weight < 1 / S and scores[j] >= others.max():
            raise Wrong(f"for {case} key j gets {got[j].item():.3f}: that weight is below 1/S = {1 / S:.3g}, the share "
                        "of equal scores, so key j must score *lower* than the other keys (a negative gap)")
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
    minutes=20, difficulty=3, importance=3,
))
