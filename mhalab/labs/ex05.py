"""Exercises of notebook 05 (what more heads really cost): a width-two head that looks back for any
sequence length, where a width-one head can look, and choosing a head count for a width."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, describe, expect_shape, expect_whole
from .verdicts import Wrong

# ------------------------------------------------------------------------------------ exercise 1
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
    "05", 1, "a width-two head for any length",
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


# ------------------------------------------------------------------------------------ exercise 2
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
    "05", 2, "where a width-one head can look",
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


# ------------------------------------------------------------------------------------ exercise 3
_CHOOSE_CASES = [(64, 4, 2), (64, 3, 2), (96, 5, 8), (48, 7, 4), (512, 8, 64), (30, 4, 3), (12, 1, 12)]
_IMPOSSIBLE = [(8, 4, 4), (64, 3, 32), (10, 3, 3)]


def _choose_cases(check: Check) -> tuple[list, list]:
    """(possible, impossible) cases: the fixed ones, and when grading three drawn fresh."""
    possible, impossible = list(_CHOOSE_CASES), list(_IMPOSSIBLE)
    if check.grading:
        r = check.rng(43)
        for _ in range(3):
            case = (
                r.choice([24, 36, 48, 60, 64, 72, 96, 120, 128, 192, 256, 384]),
                r.randint(1, 12),
                r.choice([2, 4, 8, 16, 32]),
            )
            try:
                check.reference(*case)
                possible.append(case)
            except ValueError:
                impossible.append(case)
    return possible, impossible


def _check_choose(choose_heads, check: Check) -> None:
    possible, impossible = _choose_cases(check)
    for d_model, n_relations, min_d_k in possible:
        case = f"d_model={d_model}, n_relations={n_relations}, min_d_k={min_d_k}"
        got = check.call(choose_heads, d_model, n_relations, min_d_k, label=case)
        h = expect_whole(got, f"the head count for {case}")
        if h < 1 or d_model % h:
            raise Wrong(f"for {case} your head count does not divide d_model, so d_k = d_model / h is not whole")
        if h < n_relations:
            raise Wrong(f"for {case} there are fewer heads than relations: some head must blend two roles")
        if d_model // h < min_d_k:
            raise Wrong(f"for {case} your heads are narrower than min_d_k: too thin for the job")
        if h != check.reference(d_model, n_relations, min_d_k):
            raise Wrong(f"for {case} a head count with fewer, wider heads also gives every relation its own head: "
                        "take the smallest head count that works")
    for d_model, n_relations, min_d_k in impossible:
        case = f"d_model={d_model}, n_relations={n_relations}, min_d_k={min_d_k}"
        try:
            h = check.call(choose_heads, d_model, n_relations, min_d_k, label=case, allow=(ValueError,))
        except ValueError:
            continue
        raise Wrong(f"for {case} no head count satisfies both rules, but your function returned {h!r}; "
                    "raise ValueError saying why instead")


register(Exercise(
    "05", 3, "choose a head count for a width",
    _check_choose,
    hint=["Try h = n_relations, n_relations + 1, ... and keep the first that divides d_model.",
          "Then check its d_k = d_model // h against min_d_k: a larger h only makes heads narrower, so if the first "
          "fails, all later ones fail too (raise ValueError)."],
    solution=(
        "def choose_heads(d_model, n_relations, min_d_k):\n"
        "    for h in range(n_relations, d_model + 1):      # at least one head per relation\n"
        "        if d_model % h == 0:                        # d_k must be whole\n"
        "            if d_model // h < min_d_k:              # the widest valid heads are already too thin\n"
        "                break\n"
        "            return h\n"
        "    raise ValueError(f'no head count gives {n_relations} heads of width >= {min_d_k} at d_model={d_model}')"
    ),
    minutes=10, difficulty=2, importance=2,
))
