"""Exercises of notebook 05 (what more heads really cost): the rank of a head's scores when tokens repeat, a
width-two head that looks back for any sequence length, where a width-one head can look, and how long a width-two
head's query must be to single out one of n keys on a circle."""

from __future__ import annotations

import math

import torch

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, consistent_mistake, describe, expect_shape, expect_whole, unseparated
from .verdicts import AnswerRaised, Wrong


def _tokens(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------------------------ exercise 1
# (d_model, d_head, query tokens, key tokens, what): each reading below differs from the right one on some case
_RANK_CASES = [
    (16, 8, _tokens(3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 9), _tokens(3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 9),
     "self-attention, 12 tokens, 7 distinct"),
    (4, 16, _tokens(*range(10)), _tokens(*range(10, 20)), "heads wider than the model"),
    (32, 3, _tokens(*range(9)), _tokens(*range(9)), "9 distinct tokens, narrow head"),
    (16, 8, _tokens(0, 1, 0, 1, 1, 0), _tokens(2, 3, 4, 5, 6, 7, 8), "queries of 2 tokens, keys of 7"),
    (16, 8, _tokens(*range(6)), _tokens(3, 3, 3, 1, 1), "queries of 6 tokens, keys of 2"),
    (16, 8, _tokens(1, 2, 3, 1, 2, 3), _tokens(3, 4, 5, 6, 4), "queries and keys share one token"),
    (8, 6, _tokens(7, 7, 7, 7, 7), _tokens(7, 7, 7, 7, 7), "one token, repeated"),
    (64, 1, _tokens(*range(20)), _tokens(*range(20)), "a width-one head"),
]


def _distinct(tokens: torch.Tensor) -> int:
    return len(set(tokens.tolist()))


def _rank_mistakes(d_model: int, d_head: int, q: torch.Tensor, k: torch.Tensor) -> dict[str, int]:
    """{what a plausible reading missed: the rank it predicts} for one case."""
    uq, uk = _distinct(q), _distinct(k)
    union, shared = len(set(q.tolist()) | set(k.tolist())), len(set(q.tolist()) & set(k.tolist()))
    return {
        "that is section 2's min(d_k, T) with positions for T: here tokens repeat, and the queries and keys are made "
        "from embeddings only d_model wide. Count what bounds each factor of the scores":
            min(d_head, len(q), len(k)),
        "a repeated token has the same embedding, so the same query (and the same key): count distinct tokens, not "
        "positions": min(d_model, d_head, len(q), len(k)),
        "d_head may be larger than d_model (section 1's decoupled heads): each query and key is made from a token's "
        "d_model numbers, so the rank cannot exceed d_model either": min(d_head, uq, uk),
        "the head's own width d_head bounds the rank too (section 2's bottleneck)": min(d_model, uq, uk),
        "the queries and the keys each bound the rank on their own: the smaller of the two distinct counts, not "
        "the distinct tokens of both together": min(d_model, d_head, union),
        "the keys bound the rank too: the score matrix has no more independent columns than distinct keys":
            min(d_model, d_head, uq),
        "the queries bound the rank too: the score matrix has no more independent rows than distinct queries":
            min(d_model, d_head, uk),
        "a query and a key need not be the same token to score: each side's distinct tokens bound the rank, not "
        "the tokens the two sides share": min(d_model, d_head, shared),
        "the tokens bound the rank too: the score matrix has no more independent rows than distinct queries":
            min(d_model, d_head),
    }


def _rank_cases(check: Check) -> list[tuple[int, int, torch.Tensor, torch.Tensor, str]]:
    cases = list(_RANK_CASES)
    if check.grading:  # three drawn fresh, redrawn a few times at most until every reading gives its own ranks
        for attempt in range(20):
            r = check.rng(41 + 1000 * attempt)
            drawn = []
            for i in range(3):
                d_model, d_head, vocab = r.choice([4, 8, 12, 16, 32]), r.choice([1, 2, 3, 4, 6, 8, 16, 24]), \
                    r.randint(2, 30)
                q = _tokens(*(r.randrange(vocab) for _ in range(r.randint(1, 24))))
                k = q if r.random() < 0.5 else _tokens(*(r.randrange(vocab) for _ in range(r.randint(1, 24))))
                drawn.append((d_model, d_head, q, k, f"drawn case {i}"))
            every = cases + drawn
            if not unseparated([_rank(*c[:4]) for c in every], [_rank_mistakes(*c[:4]) for c in every], _equal):
                break
        cases += drawn
    return cases


def _rank(d_model: int, d_head: int, q: torch.Tensor, k: torch.Tensor) -> int:
    """The checker's own reading (for drawing cases; the answer is the solution's)."""
    return min(d_model, d_head, _distinct(q), _distinct(k))


def _equal(a, b) -> bool:
    return a == b


def _rank_label(d_model, d_head, q, k, what) -> str:
    return f"d_model={d_model}, d_head={d_head}, query_tokens={q.tolist()}, key_tokens={k.tolist()} ({what})"


def _check_rank(score_rank, check: Check) -> None:
    cases, got, raised = _rank_cases(check), [], None
    for case in cases:
        label = _rank_label(*case)
        try:
            value = check.call(score_rank, *case[:4], label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        got.append(expect_whole(value, f"the rank for {label}"))
    cases = cases[:len(got)]
    wants = [int(check.reference(*c[:4])) for c in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    missed = consistent_mistake(got, wants, [_rank_mistakes(*c[:4]) for c in cases], _equal)
    if missed:
        raise Wrong(f"for {_rank_label(*cases[bad])} you said {got[bad]}, the rank is {wants[bad]}: {missed}")
    raise Wrong(f"for {_rank_label(*cases[bad])} you said {got[bad]}, the rank is {wants[bad]}. The scores are "
                "E_q W_Q W_K\u1d40 E_k\u1d40: what bounds the rank of each factor?")


register(Exercise(
    "05", 1, "the rank of a head's scores when tokens repeat",
    _check_rank,
    hint=["Write the scores as a product of four matrices: the queries' embeddings E_q [L, d_model], W_Q "
          "[d_model, d_head], W_K\u1d40 [d_head, d_model] and the keys' embeddings E_k\u1d40 [d_model, S]. A product's "
          "rank is at most the rank of each factor.",
          "Two positions holding the same token have the same embedding row: how many different rows has E_q? "
          "With random weights the rank is the smallest of the bounds."],
    solution=(
        "def score_rank(d_model, d_head, query_tokens, key_tokens):\n"
        "    distinct_queries = len(set(query_tokens.tolist()))   # a repeated token repeats its query row\n"
        "    distinct_keys = len(set(key_tokens.tolist()))        # ... and its key row\n"
        "    return min(d_model, d_head, distinct_queries, distinct_keys)"
    ),
    minutes=10, difficulty=2, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 2
_LOOK_BACK_CASES = [(16, 1), (9, 7), (64, 3), (200, 2), (128, 5)]  # (seq_len, offset): longer than the notebook's


def _look_back_weights(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return (Q @ K.T).softmax(-1)  # [T, T], scores as in section 2 (no scale, no mask)


def _look_back_cases(check: Check) -> list[tuple[int, int]]:
    """The fixed cases, and when grading two drawn fresh."""
    r = check.rng(40)
    fresh = [(T, r.randint(1, min(8, T - 1))) for T in (r.randint(20, 200), r.randint(20, 200))]
    return list(_LOOK_BACK_CASES) + (fresh if check.grading else [])


def _check_look_back(look_back_qk, check: Check) -> None:
    for T, offset in _look_back_cases(check):
        case = f"seq_len={T}, offset={offset}"
        got = check.call(look_back_qk, T, offset, label=case)
        if hasattr(got, "shape") and tuple(got.shape)[:1] == (2,):  # torch.stack([Q, K]) is a pair too
            got = (got[0], got[1])
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"return a pair (Q, K) of two [seq_len, 2] tensors; for {case} you returned {describe(got)}")
        Q, K = (as_float64(t, f"{n} for {case}") for t, n in zip(got, ("Q", "K")))
        for t, n in ((Q, "Q"), (K, "K")):
            expect_shape(t, (T, 2), f"{n} for {case}")
            if not torch.isfinite(t).all():
                raise Wrong(f"{n} for {case} has entries that are not finite numbers")
        weights = _look_back_weights(Q, K)
        queries = torch.arange(offset, T)
        target = queries - offset
        peaks = weights[queries].argmax(-1)
        wrong = (peaks != target).nonzero().flatten()
        if wrong.numel():
            i = int(queries[wrong[0]])
            peak = int(peaks[wrong[0]])
            if (peaks == queries + offset).float().mean() > 0.5 or peak == min(i + offset, T - 1):
                swapped = torch.equal(_look_back_weights(K, Q)[queries].argmax(-1), target)
                raise Wrong(f"for {case} the queries look forward (query {i} peaks at key {peak}): turn them the other "
                            "way"
                            + ("; or, if you built them right, your Q and K are swapped: return (Q, K), the queries "
                               "first (row i of (Q @ K.T).softmax(-1) is query i's weights)" if swapped else ""))
            if peak == i:
                raise Wrong(f"for {case} query {i} peaks at its own key, not at key {i - offset}")
            raise Wrong(f"for {case} query {i} peaks at key {peak}, not at key {i - offset}: are all {T} keys in "
                        "different directions, so that no key far away scores as high as the wanted one?")
        on_target = weights[queries, target]
        if on_target.min() < 0.9:
            i = int(queries[on_target.argmin()])
            raise Wrong(f"for {case} every query peaks at the right key, but query {i} puts only {on_target.min():.0%} "
                        "of its weight there (at least 90% is asked): the best score must beat its neighbours by more. "
                        "What sets that gap, and how does it change as seq_len grows?")


register(Exercise(
    "05", 2, "a width-two head for any length",
    _check_look_back,
    hint=["Section 2 puts the keys on a circle and rotates each query back. Two things break for long sequences: "
          "keys may wrap around the circle, and neighbouring keys get closer together.",
          "With keys at angles omega * j, query i pointing at key i - offset with length R scores key j as "
          "R cos(omega (i - offset - j)); the nearest rival loses R (1 - cos omega). Against seq_len - 1 rivals, "
          "how large must that gap be for 90% of the weight?"],
    solution=(
        "def look_back_qk(seq_len, offset):\n"
        "    omega = math.pi / seq_len                                     # half a circle: keys never wrap\n"
        "    radius = 2 * math.log(9 * seq_len) / (1 - math.cos(omega))    # gap to the nearest rival: 2 log(9 T)\n"
        "    angles = omega * torch.arange(seq_len, dtype=torch.float64)\n"
        "    K = torch.stack([angles.cos(), angles.sin()], -1)             # [T, 2]\n"
        "    back = angles - offset * omega\n"
        "    Q = radius * torch.stack([back.cos(), back.sin()], -1)        # [T, 2]: query i points at key i - offset\n"
        "    return Q, K"
    ),
    minutes=25, difficulty=4, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 3
_WATCHED = (3000, 4000)  # the case whose allocations are watched: its L x S matrix takes 12 MB even as booleans


def _favourite_cases(check: Check) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = check.generator(4)
    cases = []
    for L, S in [(50, 70), (12, 12), (1, 30), (40, 3), _WATCHED]:
        q = torch.randn(L, generator=g)
        q[q.abs() < 0.05] = 0.5  # no query near zero (a zero query weighs every key equally)
        cases.append((q, torch.randn(S, generator=g) * 3))
    q = torch.tensor([2.0, -1.0, 0.5, -3.0])  # mixed signs, so "always the largest key" fails
    cases.append((q, torch.tensor([0.3, -2.0, 1.5, 0.1, -0.4])))
    return cases


def _check_favourite(favourite_keys, check: Check) -> None:
    for q, k in _favourite_cases(check):
        L, S = len(q), len(k)
        case = f"q of {L} queries ({int((q < 0).sum())} negative), k of {S} keys"
        watched = (L, S) == _WATCHED
        got = check.call(favourite_keys, q, k, label=case, facts=("largest_bytes",) if watched else ())
        largest = check.observe("largest_bytes") if watched else 0
        got = as_float64(got, f"what favourite_keys({case}) returned")
        if got.shape != (L,):
            raise Wrong(f"return one key position per query, a tensor of shape [{L}], got shape {list(got.shape)} for "
                        f"{case}")
        if not torch.equal(got, got.round()):
            raise Wrong(f"return key *positions* (whole numbers), got fractional values for {case}")
        want = check.reference(q, k)
        bad = got.long() != want
        if bad.any():
            i = int(bad.nonzero()[0])
            sign = "negative" if q[i] < 0 else "positive"
            raise Wrong(f"for {case}, query {i} (its q is {sign}) gets the wrong key: for a fixed query the score "
                        "q*k_j is a straight line in k_j; which end of the keys does its slope favour?")
        if largest >= L * S:  # an L x S matrix takes a byte an entry at least, whatever its dtype or library
            # (no byte count in the message: allocators differ a little between the learner's and the grading kernel)
            raise Wrong(f"right positions, but for {case} your function built an array as large as the {L} x {S} "
                        "score matrix (torch or NumPy); the exercise asks for an answer that never builds it")


register(Exercise(
    "05", 3, "where a width-one head can look",
    _check_favourite,
    hint=["With d_k = 1 query i scores key j as q_i * k_j (two numbers). For a fixed i, how does the score "
          "change as k_j grows?",
          "If q_i > 0 the biggest k_j wins; if q_i < 0 the smallest. So every query picks one of just two keys."],
    solution=(
        "def favourite_keys(q, k):\n"
        "    # q: [L] one number per query, k: [S] one number per key (a head with d_k = 1)\n"
        "    return torch.where(q > 0, k.argmax(), k.argmin())   # [L]: positive queries take the largest key"
    ),
    minutes=15, difficulty=3, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 4
# (n_keys, min_weight): thresholds met at R = 0 (min_weight = 1 / n_keys, and below it), the cases where the
# nearest two rivals are all there is (n = 3) or one (n = 2), low weights where far keys matter, and a length past
# 709, where e^(R cos) overflows float64, and (last, so that a
# formula that divides by 1 - cos(2 pi / n) is judged on the others first) one key
_RADIUS_CASES = [(2, 0.75), (3, 0.5), (4, 0.9), (5, 0.2), (6, 0.1), (12, 0.5), (50, 0.3), (20, 0.95), (128, 0.9),
                 (1, 0.99)]
_RADIUS_RTOL = 1e-3  # float32 scores at R ~ 2400 move the answer by ~1e-4 of itself; 1e-3 leaves a factor 10
_RADIUS_ATOL = 1e-6


def _gaps(n: int, arc: float = 2 * math.pi) -> torch.Tensor:
    """[n]: how far below the right key's score each key's lies, per unit of query length (keys ``arc / n`` apart)."""
    return 1 - torch.cos(arc * torch.arange(n, dtype=torch.float64) / n)


def _shortest(gaps: torch.Tensor, min_weight: float) -> float:
    """The smallest R >= 0 with 1 / sum_m exp(-R gaps_m) >= min_weight (the weight grows with R: bisection)."""
    weight = lambda R: float(1 / torch.exp(-R * gaps).sum())  # noqa: E731
    if weight(0.0) >= min_weight:
        return 0.0
    lo, hi = 0.0, 1.0
    while weight(hi) < min_weight:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if weight(mid) < min_weight else (lo, mid)
    return hi


def _radius_mistakes(n: int, w: float) -> dict[str, float]:
    """{what a plausible derivation missed: the length it gives} for one case (absent where it cannot be read)."""
    out = {}
    if n >= 2:
        near = 1 - math.cos(2 * math.pi / n)  # the nearest rival's margin per unit of R
        out["you counted one nearest rival; on the circle there is one on each side (and more beyond)"] = \
            max(0.0, math.log(w / (1 - w)) / near)
        out["you counted only the two nearest rivals: the farther keys take a share too, which matters when "
            "min_weight is low or the keys many; sum over every key"] = max(0.0, math.log(2 * w / (1 - w)) / near)
        out["you priced every rival at the nearest one's margin: that is enough (Exercise 2's bound) but not the "
            "shortest length, since the farther keys score lower"] = max(0.0, math.log((n - 1) * w / (1 - w)) / near)
        out["the right key's own term belongs in the softmax's denominator: its weight is e^R over the sum of "
            "e^(R cos) over *every* key, itself included"] = _shortest(_gaps(n)[1:], w)
    out["you used the small-angle margin 2\u03c0\u00b2R/n\u00b2: for few keys 1 - cos(2\u03c0/n) is noticeably "
        "smaller; use the exact scores R cos(\u03b8)"] = max(0.0, math.log(2 * w / (1 - w)) * n**2 / (2 * math.pi**2))
    out["the scores here are not scaled (no 1/\u221ad_k), as in the cell above"] = math.sqrt(2) * _shortest(_gaps(n), w)
    out["the keys here go round the whole circle, 2\u03c0/n apart (Exercise 2's keys spread over half of it so as "
        "not to wrap)"] = _shortest(_gaps(n, math.pi), w)
    return out


def _radius_cases(check: Check) -> list[tuple[int, float]]:
    cases = list(_RADIUS_CASES)
    if check.grading:  # three drawn fresh, redrawn a few times at most until every reading gives its own lengths
        for attempt in range(20):
            r = check.rng(44 + 1000 * attempt)
            drawn = [(r.randint(3, 150), round(r.uniform(0.05, 0.98), 3)) for _ in range(3)]
            every = cases + drawn
            if not unseparated([_shortest(_gaps(n), w) for n, w in every], [_radius_mistakes(*c) for c in every],
                               _close_length):
                break
        cases += drawn
    return cases


def _close_length(a: float, b: float) -> bool:
    return abs(a - b) <= _RADIUS_ATOL + _RADIUS_RTOL * abs(b)


def _check_radius(radius_needed, check: Check) -> None:
    cases, got, raised = _radius_cases(check), [], None
    for n, w in cases:
        label = f"n_keys={n}, min_weight={w}"
        try:
            value = as_float64(check.call(radius_needed, n, w, label=label), f"the length for {label}")
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if value.numel() != 1:
            raise Wrong(f"return one number, the query's length, for {label}; got a tensor of shape "
                        f"{list(value.shape)}")
        length = value.item()
        if math.isnan(length) or math.isinf(length):
            raise Wrong(f"for {label} your length is {length}: is some exp(R cos \u03b8) overflowing? (in float64 "
                        "it does past R \u2248 709; divide the weight's numerator and denominator by e^R first)")
        if length < -_RADIUS_ATOL:
            raise Wrong(f"for {label} your length is negative ({length:.4g}): the length is at least 0, and when "
                        "min_weight is at most 1 / n_keys even a zero query (all weights equal) is long enough")
        got.append(length)
    cases = cases[:len(got)]
    wants = [float(check.reference(n, w)) for n, w in cases]
    if all(_close_length(g, v) for g, v in zip(got, wants)):
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, v) in enumerate(zip(got, wants)) if not _close_length(g, v))
    n, w = cases[bad]
    said = f"for n_keys={n}, min_weight={w} you said {got[bad]:.6g}, the shortest length is {wants[bad]:.6g}"
    missed = consistent_mistake(got, wants, [_radius_mistakes(*c) for c in cases], _close_length)
    if missed:
        raise Wrong(f"{said}: {missed}")
    at = float(1 / torch.exp(-max(got[bad], 0.0) * _gaps(n)).sum())
    raise Wrong(f"{said}; at your length the right key gets {at:.4g} of the weight"
                + (" (more than asked: a shorter query would do)" if at > w else " (less than asked)")
                + (". Past R \u2248 709, e^(R cos \u03b8) overflows float64: divide by e^R first" if wants[bad] > 700
                   else ""))


register(Exercise(
    "05", 4, "how long a width-two query must be",
    _check_radius,
    hint=["Query j scores key m as R cos(\u03b8_m - \u03b8_j). Its weight on key j is e^R divided by the sum of "
          "e^(R cos) over all n keys; divide both by e^R and each key contributes e^(-R (1 - cos(2\u03c0m/n))).",
          "That weight grows with R (every term but the right key's own shrinks), so the shortest R is where it "
          "equals min_weight: find it by bisection, doubling an upper end until it is long enough. When the weight "
          "at R = 0 (1 / n_keys) is already enough, the answer is 0."],
    solution=(
        "def radius_needed(n_keys, min_weight):\n"
        "    angles = 2 * math.pi * torch.arange(n_keys, dtype=torch.float64) / n_keys   # [n] keys round the circle\n"
        "    below = 1 - torch.cos(angles)          # [n]: each key's score below the right one's, per unit of R\n"
        "    def weight(R):                         # the right key's weight, e^R / sum e^(R cos), divided by e^R\n"
        "        return 1 / torch.exp(-R * below).sum()\n"
        "    if weight(0.0) >= min_weight:          # uniform weights (1 / n) are already enough\n"
        "        return 0.0\n"
        "    lo, hi = 0.0, 1.0\n"
        "    while weight(hi) < min_weight:         # the weight grows with R: double until long enough\n"
        "        hi *= 2\n"
        "    for _ in range(100):                   # then halve the interval\n"
        "        mid = (lo + hi) / 2\n"
        "        lo, hi = (mid, hi) if weight(mid) < min_weight else (lo, mid)\n"
        "    return hi"
    ),
    minutes=20, difficulty=3, importance=3,
))
