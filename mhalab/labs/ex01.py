"""Exercises of notebook 01 (one head): write attention from its description, deriving the scale of its scores;
then aim a query at a key."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, consistent_mistake, expect_close, expect_shape, first_match, only_output, unseparated
from .verdicts import AnswerRaised, Wrong

# ------------------------------------------------------------------------------------ exercise 1
# The hidden cases, by structure: (what, batch axes, L, S, d_k, d_v). A square one first (L == S: a transposed
# score matrix has the right shape, and raises on every later case), a general one, one and two batch axes (an axis
# counted from the front is another axis there), a single query, a single key, and scores in the thousands (a
# hand-written e^x overflows; float32 gives inf beyond 88, float64 beyond 709).
_SHAPES = [
    ("square", (), 6, 6, 16, 3),
    ("plain", (), 3, 5, 4, 2),
    ("batch", (2,), 4, 7, 8, 3),
    ("two batch axes", (2, 3), 5, 9, 6, 4),
    ("one query", (), 1, 4, 9, 6),
    ("one key", (), 3, 1, 2, 5),
    ("large", (), 5, 6, 4, 3),
]
_LARGE = 800.0  # a scaled score e^x cannot take, even in float64 (e^709 is the largest)
_MARGIN = 30.0  # in the large case every query's best key leads the next by this much: its weight is 1 - e^-30


def _drawn_shapes(check: Check, attempt: int) -> list[tuple]:
    """The cases' structure drawn fresh for a grading run: the same kinds, other sizes."""
    r = check.rng(10 + 1000 * attempt)
    width, few, batch = lambda: r.randint(4, 24), lambda: r.randint(2, 7), lambda: r.randint(2, 3)
    square = r.randint(4, 8)
    return [  # batch sizes below every width: K.T of a batched K never multiplies by accident
        ("square", (), square, square, square + r.randint(1, 16), r.randint(2, square - 1)),  # d_k, d_v: not L
        ("plain", (), few(), few() + 2, width(), few()),
        ("batch", (batch(),), few(), few() + 2, width(), few()),
        ("two batch axes", (batch(), batch()), few(), few() + 2, width(), few()),
        ("one query", (), 1, few() + 1, width(), few()),
        ("one key", (), few(), 1, width(), few()),
        ("large", (), 5, 6, 4, 3),
    ]


def _large_scores(g: torch.Generator, L: int, S: int, d_k: int) -> tuple[Tensor, Tensor]:
    """Q [L, d_k], K [S, d_k] whose scaled scores run to the thousands: query 0's best above +_LARGE, every score of
    query 1 below -_LARGE (the keys share a direction that query 0 follows and query 1 opposes), and in every row
    the best key ahead by _MARGIN, so that the exact weights are one-hot to within e^-30."""
    axis = torch.zeros(d_k)
    axis[0] = 1.0
    while True:
        K = torch.randn(S, d_k, generator=g) * 10 + axis * (20 + 20 * torch.rand(S, 1, generator=g))  # [S, d_k]
        Q = torch.randn(L, d_k, generator=g) * 40                                                      # [L, d_k]
        Q[0], Q[1] = Q[0] / 4 + 60 * axis, Q[1] / 4 - 60 * axis
        scores = (Q.double() @ K.double().T) / math.sqrt(d_k)                                          # [L, S]
        top2 = scores.topk(2, dim=-1).values                                                           # [L, 2]
        if (top2[:, 0] - top2[:, 1]).min() > _MARGIN and top2[0, 0] > _LARGE and top2[1, 0] < -_LARGE:
            return Q, K


def _make_case(g: torch.Generator, what: str, batch: tuple, L: int, S: int, d_k: int, d_v: int) -> tuple:
    if what == "large":
        Q, K = _large_scores(g, L, S, d_k)
        return Q, K, torch.randn(S, d_v, generator=g) * 1.5, what
    Q, K, V = (torch.randn(*batch, n, w, generator=g) * 1.5 for n, w in ((L, d_k), (S, d_k), (S, d_v)))
    return Q, K, V, what


def _attention_cases(check: Check) -> list[tuple[Tensor, Tensor, Tensor, str]]:
    """(Q, K, V, what) for every hidden case: the fixed ones in q.check; when grading, sizes and numbers drawn
    fresh (again, a few times at most, until every mistake the checker names gives a result of its own)."""
    return [(Q.clone(), K.clone(), V.clone(), what) for Q, K, V, what in _drawn_cases(check.seed)]


@functools.lru_cache(maxsize=4)  # one draw serves every answer judged with its seed
def _drawn_cases(seed: int | None) -> list[tuple[Tensor, Tensor, Tensor, str]]:
    check = Check(seed=seed)
    for attempt in range(20):
        shapes = _SHAPES if not check.grading else _drawn_shapes(check, attempt)
        g = check.generator(1 + 1000 * attempt)
        cases = [_make_case(g, *shape) for shape in shapes]
        if not check.grading:
            return cases
        doubled = [tuple(t.double() for t in c[:3]) for c in cases]
        if not unseparated([_attention(*c) for c in doubled], [_attention_mistakes(*c) for c in doubled], _same):
            break
    return cases


def _attention(Q: Tensor, K: Tensor, V: Tensor, *, scale: float | None = None, over: int = -1) -> Tensor:
    """softmax(Q Kᵀ / scale) V, the softmax over axis ``over`` (the checker's own, for its readings)."""
    scale = math.sqrt(Q.size(-1)) if scale is None else scale
    return (Q @ K.transpose(-2, -1) / scale).softmax(over) @ V  # [..., L, d_v]


def _attention_mistakes(Q: Tensor, K: Tensor, V: Tensor) -> dict[str, Tensor]:
    """{message: what that mistake gives} on one case (float64). A mistake that does not apply to the case (an axis
    counted from the front, without batch axes) is absent: it gives the right answer there."""
    d_k, L, S, d_v = Q.size(-1), Q.size(-2), K.size(-2), V.size(-1)
    scores = Q @ K.transpose(-2, -1)  # [..., L, S]
    root = math.sqrt(d_k)
    centred = scores - scores.mean(-1, keepdim=True)
    row_spread = (centred.pow(2).sum(-1, keepdim=True) / (S - 1)).sqrt()  # [..., L, 1]: NaN for one key, as std's
    mistakes = {
        "the scores are not scaled. For entries of variance 1, q·k is a sum of d_k independent terms q_i k_i of "
        "variance 1 each, so its variance is d_k: dividing by c divides the variance by c², so c = sqrt(d_k)":
            _attention(Q, K, V, scale=1.0),
        "the scores are divided by d_k, their variance; dividing by c divides the variance by c², so the variance "
        "is 1 for c = sqrt(d_k), the standard deviation":
            _attention(Q, K, V, scale=d_k),
        "the scores are multiplied by sqrt(d_k); divide by it, so that their variance d_k becomes 1":
            _attention(Q, K, V, scale=1 / root),
        "the scores are divided by 2·d_k: in Python, s / d_k ** 1/2 is (s / d_k) / 2, since ** binds tighter than "
        "/; write d_k ** 0.5 or math.sqrt(d_k)":
            _attention(Q, K, V, scale=2 * d_k),
        "the scores are divided by d_k / 2: in Python, d_k ** 1/2 is (d_k ** 1) / 2, since ** binds tighter than /; "
        "write d_k ** 0.5 or math.sqrt(d_k)":
            _attention(Q, K, V, scale=d_k / 2),
        "the scale uses the number of keys, S = K.size(-2); the variance of one score q·k depends on the width of q "
        "and k alone, d_k = Q.size(-1)":
            _attention(Q, K, V, scale=math.sqrt(S)),
        "the scale uses the number of queries, L = Q.size(-2); the variance of one score q·k depends on the width of "
        "q and k alone, d_k = Q.size(-1)":
            _attention(Q, K, V, scale=math.sqrt(L)),
        "the scale uses the width of the values, d_v = V.size(-1); the scores are dot products of queries and keys, "
        "so it is their width, d_k = Q.size(-1)":
            _attention(Q, K, V, scale=math.sqrt(d_v)),
        "the scale uses Q.shape[0] (len(Q)), the first axis: the queries, or a batch axis; d_k is the last axis, "
        "Q.size(-1)":
            _attention(Q, K, V, scale=math.sqrt(Q.size(0))),
        "the scores are divided by their own measured spread (their std); the scale is a constant fixed by d_k "
        "alone, the spread the scores have when the entries of Q and K have variance 1, so that how large training "
        "makes Q and K still sets how sharp the weights are":
            (scores / scores.std()).softmax(-1) @ V,
        "the scores are divided by their own measured spread, row by row (their std over the keys); the scale is "
        "a constant fixed by d_k alone, the spread the scores have when the entries of Q and K have variance 1":
            (scores / row_spread).softmax(-1) @ V,
        "the softmax runs over the queries (dim=-2); each query's weights must sum to 1 over the keys, the last axis "
        "(dim=-1)":
            _attention(Q, K, V, over=-2),
        "the softmax runs over axis 0, the first: the queries, or a batch axis; each query's weights must sum to 1 "
        "over the keys, the last axis (dim=-1)":
            _attention(Q, K, V, over=0),
        "the output is divided by sqrt(d_k) after the softmax; the scale goes on the scores, before it":
            _attention(Q, K, V, scale=1.0) / root,
        "the weights are a sigmoid of the scores; attention's weights are a softmax over the keys, so they sum to 1":
            (scores / root).sigmoid() @ V,
        "the weights are log-probabilities (log_softmax); attention weighs the values by the softmax itself":
            (scores / root).log_softmax(-1) @ V,
        "each query's scores are divided by their sum; the softmax exponentiates them first (exp, then divide)":
            (lambda s: s / s.sum(-1, keepdim=True))(scores / root) @ V,
    }
    if Q.dim() > 2:  # an axis counted from the front is another axis here
        mistakes.update({
            "the scale reads d_k from Q.shape[1], which is the width only when there are no batch axes; read it from "
            "the last axis, Q.size(-1)":
                _attention(Q, K, V, scale=math.sqrt(Q.size(1))),
            "the softmax runs over axis 1 (dim=1), which is the keys only when there are no batch axes; run it over "
            "the last axis, dim=-1":
                _attention(Q, K, V, over=1),
            "the softmax is given no axis: F.softmax then guesses one from the number of dimensions (axis 0 of three, "
            "axis 1 of four), which is not the keys when there are batch axes; give dim=-1":
                _attention(Q, K, V, over=0 if Q.dim() == 3 else 1),
        })
    if math.isqrt(d_k) ** 2 != d_k:  # a whole-number square root is exact only for a square d_k
        mistakes["the scale is rounded to a whole number (int(math.sqrt(d_k)) or d_k ** 0.5 // 1); divide the "
                 "scores by sqrt(d_k) exactly, which is whole only when d_k is a square"] = \
            _attention(Q, K, V, scale=float(math.isqrt(d_k)))
    if L == S:  # a transposed [S, L] matrix has the right shape only here
        mistakes.update({
            "the scores are transposed (K Qᵀ): row i must hold query i's dot products with every key, Q Kᵀ":
                (scores.transpose(-2, -1) / root).softmax(-1) @ V,
            "the weights are transposed before they weigh the values: the output is weights @ V, with the weights "
            "[L, S] as the softmax gives them":
                (scores / root).softmax(-1).transpose(-2, -1) @ V,
        })
    return mistakes


def _same(a: Tensor, b: Tensor) -> bool:
    """Two results agree: the same shape, and close by the tolerance policy (NaN where the other has NaN)."""
    return first_match(a, {"": b}) is not None


def _shape_miss(got: Tensor, want: Tensor, Q: Tensor, K: Tensor, case: str) -> None:
    if tuple(got.shape) == tuple(Q.shape[:-1]) + (K.size(-2),) and got.shape != want.shape:
        raise Wrong(f"for {case} you returned shape {list(got.shape)}: that is the [L, S] matrix of weights. "
                    f"Attention returns each query's weighted sum of the values: [L, d_v] = {list(want.shape)}")
    expect_shape(got, want.shape, f"the result for {case}")


def _unstable(got: Tensor, Q: Tensor, K: Tensor, case: str) -> None:
    """Wrong when the result is not finite on the case with large scores: e^x overflowed (the query with the case's
    largest score is broken), or underflowed to 0 / 0 (only queries whose scores lie far below it are)."""
    broken = ~torch.isfinite(got).all(-1)  # [L]: queries whose output is not finite
    if not broken.any():
        return
    best = (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).max(-1).values  # [L]: each query's largest score
    if broken[best.argmax()]:
        raise Wrong(f"for {case}, whose scaled scores run up to {best.max().item():,.0f}, your output has inf or NaN: "
                    "e^x overflows there (to inf beyond x = 88 in float32, 709 in float64) and inf / inf is NaN. The "
                    "softmax is unchanged when each row's largest score is subtracted first, e^(s - m) / Σ e^(s - m) "
                    "= e^s / Σ e^s, and then no e^x exceeds 1 (torch.softmax does so)")
    raise Wrong(f"for {case} your output has NaN for the queries whose scaled scores all lie far below the largest "
                f"of the case ({best.max().item():,.0f}): after subtracting it, e^x underflows to 0 for each of their "
                "keys, and 0 / 0 is NaN. Subtract each row's own largest score (s.max(dim=-1, keepdim=True)), not the "
                "largest of the whole matrix, and every row's best key gets e^0 = 1")


def _case_label(Q: Tensor, K: Tensor, V: Tensor) -> str:
    return f"Q {list(Q.shape)}, K {list(K.shape)}, V {list(V.shape)}"


def _shared_reading(got: list, wrong: list[int], judged: list) -> str | None:
    """The first mistake of the first wrong case that also gives what the answer gave on every other wrong case where
    that mistake applies: a reading that fits one case by coincidence (int(sqrt(8)) = 2 = sqrt(4) queries) is not
    named. The case with scores in the thousands is left out of that test: a mistake's float32 rounding there is
    of the order of its scores, not of the answer's."""
    readings = [_attention_mistakes(*judged[i][:3]) for i in wrong]
    for message, value in readings[0].items():
        if _same(got[wrong[0]], value) and all(message not in r or judged[i][3] == "large" or _same(got[i], r[message])
                                               for i, r in zip(wrong[1:], readings[1:])):
            return message
    return None


def _check_attention(attention, check: Check) -> None:
    cases = _attention_cases(check)
    got, raised = [], None
    for Q, K, V, _ in cases:  # every case first, so that a mistake is named by what it gives on all of them
        case = _case_label(Q, K, V)
        try:
            value = check.call(attention, Q, K, V, label=case)
        except AnswerRaised as error:
            raised = (error, Q.dim() - 2)
            break
        got.append(as_float64(only_output(value, f"what attention({case}) returned"),
                              f"what attention({case}) returned"))
    judged = [tuple(t.double() for t in c[:3]) + (c[3],) for c in cases[:len(got)]]
    wants = [check.reference(Q, K, V) for Q, K, V, _ in judged]
    for g, w, (Q, K, V, _) in zip(got, wants, judged):
        _shape_miss(g, w, Q, K, _case_label(Q, K, V))
    wrong = [i for i, (g, w) in enumerate(zip(got, wants)) if not _same(g, w)]
    if not wrong:
        if raised:
            error, batch = raised
            axes = "no batch axis" if batch == 0 else f"{batch} batch ax{'i' if batch == 1 else 'e'}s"
            raise AnswerRaised(f"{error} (this case has {axes} in front of [L, d_k]: count the axes from the end, "
                               "K.transpose(-2, -1) or K.mT and Q.size(-1), with operations that take any batch axes, "
                               "such as @)")
        return
    first = _case_label(*judged[wrong[0]][:3])
    mistake = consistent_mistake(got, wants, [_attention_mistakes(*c[:3]) for c in judged], _same)
    if mistake:
        raise Wrong(f"for {first}: {mistake}")
    for i in wrong:
        Q, K, V, what = judged[i]
        if what == "large":
            _unstable(got[i], Q, K, _case_label(Q, K, V))
    mistake = _shared_reading(got, wrong, judged)
    if mistake:  # a reading of the cases where it applies (not of all of them): said for the first wrong case
        raise Wrong(f"for {first}: {mistake}")
    expect_close(got[wrong[0]], wants[wrong[0]], f"for {first}, the result")


register(Exercise(
    "01", 1, "attention from scratch",
    _check_attention,
    hint=["q·k = q_1 k_1 + ... + q_dk k_dk. One term q_i k_i, of two independent numbers with mean 0 and variance 1, "
          "has variance E[q_i²] E[k_i²] = 1; the variances of independent terms add. And dividing a number by c "
          "divides its variance by c².",
          "So Var(q·k) = d_k, and c = sqrt(d_k) with d_k = Q.size(-1). Then scores = Q @ K.transpose(-2, -1) / c "
          "(transpose counted from the end, for the batch axes), weights = scores.softmax(dim=-1) (over the keys; "
          "torch.softmax subtracts each row's largest score, so it stays finite), and return weights @ V."],
    solution=(
        "def attention(Q, K, V):\n"
        "    d_k = Q.size(-1)\n"
        "    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)   # [..., L, S]: Var(q·k) = d_k, so std 1 after this\n"
        "    weights = scores.softmax(dim=-1)                     # each query's weights sum to 1 over the keys\n"
        "    return weights @ V                                   # [..., L, d_v]"
    ),
    minutes=15, difficulty=2, importance=5,
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
