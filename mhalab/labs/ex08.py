"""Exercises of notebook 08 (a real encoder), in the notebook's order: is the paraphrase gap more than chance (an
exact permutation test, designed), how much of a head's output comes from [CLS] and [SEP] once each weight counts
times the norm of what its key sends (Kobayashi et al. 2020), and the best fixed offset of every head, previous or
next, near or far.

All three run on hidden inputs: similarity matrices that are not symmetric (row i: the first sentence of pair i,
column j: the second of j), of one to seven pairs, whose entries are multiples of 1/64 so that tied re-pairings tie
exactly (one ties with the truth, one has the true pairing worst of all, one has every entry equal); attention
patterns of several sentences and heads with a pull towards a key that sends little, beside values whose norms
vary by position, and as many heads as positions and dimensions; and patterns with heads planted at offsets on
either side, ties between offsets (exact, in multiples of 1/64), offsets longer than the sentence, batches of several
sentences and heads that park their weight on [CLS]. When grading, two more cases are drawn fresh for each. The
prompts forbid nothing: any helper of mhalab or torch may run.
"""

from __future__ import annotations

import itertools
import math

import torch

from .calls import Check
from .core import Exercise, register
from .judging import ATOL, RTOL, answers_until_raised, as_float64, consistent_mistake, describe, unseparated
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _matched_sums(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every permutation sigma of range(n), the identity first, ``[n!, n]``, and each one's sum of S[i, sigma(i)]
    ``[n!]`` (in float64; the hidden similarities are multiples of 1/64, so every sum is exact and ties are ties)."""
    n = S.size(0)
    perms = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long).view(-1, n)  # [n!, n]
    return perms, S.double()[torch.arange(n), perms].sum(-1)  # S[i, perms[p, i]] summed over i: [n!]


def _p_value(S: torch.Tensor) -> float:
    """The exact p (the checker's own reading, for drawing cases; the answer is the solution's)."""
    _, sums = _matched_sums(S)
    return float((sums >= sums[0]).double().mean())


def _p_mistakes(S: torch.Tensor) -> dict[str, float]:
    """{message: the p that reading gives} for one similarity matrix (absent where the reading gives no number)."""
    n = S.size(0)
    perms, sums = _matched_sums(S)
    true, others, count = sums[0], sums[1:], math.factorial(n)
    out = {
        "a re-pairing whose gap equals the true one's counts (>=, not >): ties count, and the true pairing itself, "
        "one of the n! re-pairings, always ties with itself, so p is never below 1/n!":
            float((sums > true).double().mean()),
        "re-pairings that tie with the true pairing count too (>=, not >): their gap is as wide as the true one's":
            float((1 + (others > true).sum()) / count),
        "p counts the re-pairings whose gap is at least the true one's (as wide or wider), not at most":
            float((sums <= true).double().mean()),
        "return the fraction of the n! re-pairings, not their count": float((sums >= true).sum()),
        "permuting the rows and the columns together relabels the pairs and keeps every true pair matched: re-pair "
        "by permuting the second sentences (the columns) only": 1.0,
    }
    if n > 1:
        out["the true pairing is one of the n! re-pairings (the identity): count it, so p is at least 1/n!"] = \
            float((others >= true).sum() / count)
        out["the true pairing is one of the re-pairings: count it, in the count and in the n! you divide by"] = \
            float((others >= true).double().mean())
        gap = true / n - (S.double().sum() - true) / (n * n - n)
        out["compare like with like: each re-pairing's gap with the true gap, or each re-pairing's matched mean with "
            "the true matched mean, not a matched mean with a gap"] = float((sums / n >= gap).double().mean())
    broken = ~(perms == torch.arange(n)).any(-1)  # [n!]: re-pairings that break every true pair
    if broken.any():
        out["every permutation of the second sentences is a re-pairing, also those that keep some true pairs (and "
            "the identity), not only those that break every pair"] = float((sums[broken] >= true).double().mean())
    swaps = (perms != torch.arange(n)).sum(-1) <= 2  # [n!]: the identity and the swaps of two
    out["every permutation of the second sentences is a re-pairing, not only the swaps of two"] = \
        float((sums[swaps] >= true).double().mean())
    return out


def _sixty_fourths(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32) / 64  # exact in float32: every sum of them is exact too


def _drawn_similarity(g: torch.Generator, n: int, boost: float) -> torch.Tensor:
    """[n, n], multiples of 1/64 in [-1, 1]: noise, plus ``boost`` on the true pairs (paraphrase-like when large)."""
    S = torch.rand(n, n, generator=g) * 0.8 - 0.2 + boost * torch.eye(n)
    return (S.clamp(-1, 1) * 64).round() / 64


def _gap_cases(check: Check) -> list[tuple[torch.Tensor, str]]:
    """The fixed cases (one pair last, so that an answer that divides by n - 1 is judged on the others first); when
    grading, two drawn fresh as well (again a few times at most until every reading gives a p of its own)."""
    g = check.generator(9)
    worst = _drawn_similarity(g, 5, 0.0).abs() + 1 / 64  # off the diagonal positive...
    worst.fill_diagonal_(-0.5)                             # ...and every true pair the least similar
    cases = [
        (_drawn_similarity(g, 4, 0.6), "4 pairs, paraphrase-like"),
        (_sixty_fourths([[40, 40, 10], [40, 40, 10], [5, 20, 30]]), "3 pairs, one re-pairing ties the true one"),
        (_sixty_fourths([[48, 16], [8, 32]]), "2 pairs"),
        (worst, "5 pairs, the true pairing the worst of all"),
        (_drawn_similarity(g, 7, 0.25), "7 pairs, noisy"),
        (torch.full((4, 4), 0.5), "4 pairs, every similarity the same"),
        (_drawn_similarity(g, 6, 0.0), "6 pairs, no relation"),
    ]
    last = [(_sixty_fourths([[20]]), "1 pair")]
    if not check.grading:
        return cases + last
    for attempt in range(20):
        r, g = check.rng(72 + 1000 * attempt), check.generator(90 + 1000 * attempt)
        drawn = [(_drawn_similarity(g, r.randint(3, 7), r.uniform(0.0, 0.5)), f"drawn case {i}") for i in range(2)]
        every = cases + drawn + last
        if not unseparated([_p_value(S) for S, _ in every], [_p_mistakes(S) for S, _ in every], _same_p):
            break
    return cases + drawn + last


def _same_p(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6  # float32's rounding of a fraction; two p-values of n <= 7 pairs differ by 1/5040


def _check_gap(gap_p_value, check: Check) -> None:
    cases = _gap_cases(check)

    def call(case):
        S, what = case
        label = f"similarity {list(S.shape)} ({what})"
        value = as_float64(check.call(gap_p_value, S, label=label), f"what gap_p_value({label}) returned")
        if value.numel() != 1:
            raise Wrong(f"gap_p_value({label}): return one number, the p-value; got a tensor of shape "
                        f"{list(value.shape)}")
        return value.item()

    got, raised = answers_until_raised(cases, call)
    raised_on = cases[len(got)][0] if raised is not None else None
    cases = cases[:len(got)]
    wants = [float(check.reference(S.clone())) for S, _ in cases]
    if all(_same_p(a, b) for a, b in zip(got, wants)):
        if raised_on is not None and raised_on.size(0) == 1:
            raise Wrong(f"{raised}. With one pair there is one pairing, the true one: p = 1 (the gap needs two "
                        "pairs, but the matched means, whose order is the gaps' order, do not)") from None
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (a, b) in enumerate(zip(got, wants)) if not _same_p(a, b))
    S, what = cases[bad]
    n, p = S.size(0), got[bad]
    said = f"gap_p_value(similarity {list(S.shape)} ({what})) is {p:.6g}"
    if n == 1:
        raise Wrong(f"{said}: with one pair there is one pairing, the true one, so p = 1 (the gap needs two pairs, "
                    "but the matched means, whose order is the gaps' order, do not)")
    pairs = [i for i, (S, _) in enumerate(cases) if S.size(0) > 1]  # one pair has its own message, above
    missed = consistent_mistake([got[i] for i in pairs], [wants[i] for i in pairs],
                                [_p_mistakes(cases[i][0]) for i in pairs], _same_p)
    if missed:
        raise Wrong(f"{said}: {missed}")
    if math.isnan(p):
        raise Wrong(f"{said}: a NaN; is some mean taken over no entries?")
    whole = p * math.factorial(n)
    if abs(whole - round(whole)) > 1e-3:
        raise Wrong(f"{said}, not a whole number of the {math.factorial(n)} re-pairings over {math.factorial(n)}: the "
                    "exact test counts every permutation of the second sentences (itertools.permutations), it does "
                    "not sample them")
    if p < 1 / math.factorial(n) - 1e-6:
        raise Wrong(f"{said}: p is at least 1/n!, since the true pairing is one of the re-pairings")
    raise Wrong(f"{said}, {round(whole)} of the {math.factorial(n)} re-pairings; that is too "
                + ("many" if p > wants[bad] else "few") + ": a re-pairing sigma matches first sentence i with second "
                "sentence sigma(i); what is its gap, and which of them are at least as wide as the true one?")


register(Exercise(
    "08", 1, "is the paraphrase gap more than chance?",
    _check_gap,
    hint=["Re-pairing by sigma makes the entries similarity[i, sigma(i)] the matched pairs and every other entry a "
          "mismatched one. The sum of all n * n entries does not change: write the gap of the re-pairing with the "
          "matched sum and that total. How does it grow with the matched sum?",
          "The gap is n / (n - 1) times the mean of similarity[i, sigma(i)], minus a constant: re-pairings order by "
          "their matched mean. itertools.permutations(range(n)) gives all n! of them, the identity (the true "
          "pairing) included; count those whose matched mean is >= the true one's, and divide by n!."],
    solution=(
        "def gap_p_value(similarity):\n"
        "    import itertools\n"
        "    # similarity: [n, n], row i = first sentence of pair i, column j = second sentence of pair j\n"
        "    n = similarity.shape[0]\n"
        "    rows = torch.arange(n)\n"
        "    true = similarity.diagonal().mean()            # the gap grows with the matched mean, the total fixed\n"
        "    count = 0\n"
        "    for sigma in itertools.permutations(range(n)):  # n! re-pairings, the identity (the truth) among them\n"
        "        if similarity[rows, list(sigma)].mean() >= true:\n"
        "            count += 1\n"
        "    return count / math.factorial(n)"
    ),
    minutes=15, difficulty=3, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 2
def _share(pattern: torch.Tensor, values_out: torch.Tensor, keys: list, *, norms=True, weights=True,
           ratio="each", transpose=False, batch="all", queries="others", of="norms", heads="each") -> torch.Tensor:
    """[H]: each head's share of its weighted norms ||a_qk f(x_k)|| that goes to ``keys`` (the checker's own
    reading, for drawing cases; the answer is the solution's), and with options, the readings a learner could make
    instead."""
    P = pattern.double().transpose(-1, -2) if transpose else pattern.double()  # [B, H, T, T]
    f = values_out.double()                                                    # [B, T, H, D]
    B, H, T, _ = P.shape
    if batch == "first":
        P, f = P[:1], f[:1]
    on = torch.zeros(T, dtype=torch.bool)
    on[list(keys)] = True
    if of == "sum":  # ||sum_k a_qk f(x_k)||, over the keys given and over all keys
        mixed = lambda A: torch.einsum("bhqk,bkhd->bhqd", A, f).norm(dim=-1)  # noqa: E731  [B, H, T]
        part, whole = mixed(P * on), mixed(P)
    else:
        n = f.norm(dim=-1).permute(0, 2, 1)[:, :, None, :] if norms else torch.ones(1)  # [B, H, 1, T]: ||f(x_k)||
        c = (P if weights else torch.ones_like(P)) * n                                   # [B, H, T, T]
        part, whole = c[..., on].sum(-1), c.sum(-1)                                      # [B, H, T]
    rows = ~on if queries == "others" else torch.ones(T, dtype=torch.bool)
    part, whole = part[..., rows], whole[..., rows]                                      # [B, H, queries]
    share = part.sum(dim=(0, 2)) / whole.sum(dim=(0, 2)) if ratio == "pooled" else (part / whole).mean(dim=(0, 2))
    return share.mean().expand(H).clone() if heads == "mean" else share


def _share_mistakes(pattern: torch.Tensor, values_out: torch.Tensor, keys: list) -> dict[str, torch.Tensor]:
    read = lambda **how: _share(pattern, values_out, keys, **how)  # noqa: E731
    return {
        "that is the weight share: each weight a_qk counts times the norm ||f(x_k)|| of what key k sends, "
        "||a_qk f(x_k)|| = a_qk ||f(x_k)||": read(norms=False),
        "the weights count too: each key's term is a_qk ||f(x_k)||, not ||f(x_k)|| alone": read(weights=False),
        "take the share of each query, then the mean over the queries (and the batch): you divided the sums over "
        "the queries instead": read(ratio="pooled"),
        "pattern[..., q, k] is query q's weight on key k: the keys are the last axis, and each query's terms are "
        "shared out over its keys (you used the query axis)": read(transpose=True),
        "the queries are the other positions, those not in keys: leave the given keys out as queries":
            read(queries="all"),
        "that is the first sentence of the batch only; average over the batch too": read(batch="first"),
        "the norm of each term, a_qk ||f(x_k)||, not the norm of the summed output ||sum_k a_qk f(x_k)||: terms "
        "that point different ways would cancel": read(of="sum"),
        "the mean also runs over the heads, so every head gets the same share; one share per head": read(heads="mean"),
    }


def _share_case(g: torch.Generator, B: int, H: int, T: int, D: int, keys: list, sink: float) -> tuple:
    """(pattern [B, H, T, T] with a pull of ``sink`` towards key 0 and varying per head, values_out [B, T, H, D]
    whose norms vary by position, key 0's small)."""
    scores = torch.randn(B, H, T, T, generator=g) * 1.5
    scores[..., 0] += sink * torch.rand(H, 1, generator=g)
    scale = torch.rand(1, T, H, 1, generator=g) * 3 + 0.2
    scale[:, 0] *= 0.1  # a token that takes much weight and sends little, as [CLS] does
    return scores.softmax(-1), torch.randn(B, T, H, D, generator=g) * scale, keys


def _share_cases(check: Check) -> list[tuple]:
    g = check.generator(28)
    cases = [
        (*_share_case(g, 2, 3, 7, 5, [0, 6], 4.0), "two sentences, keys [CLS] and [SEP]"),
        (*_share_case(g, 3, 2, 5, 4, [2], 0.0), "three sentences, one middle key"),
        (*_share_case(g, 1, 4, 9, 6, [0, 4, 8], 2.0), "one sentence, three keys"),
        (*_share_case(g, 2, 5, 5, 5, [0, 4], 3.0), "as many heads as positions and dimensions"),
    ]
    if not check.grading:
        return cases
    for attempt in range(20):  # redrawn (a few times at most) until every mistake is told apart
        r = check.rng(73 + 1000 * attempt)
        drawn = []
        for i in range(2):
            T = r.randint(4, 12)
            keys = sorted(r.sample(range(T), r.randint(1, 3)))
            drawn.append((*_share_case(g, r.randint(1, 3), r.randint(1, 5), T, r.randint(2, 8), keys,
                                       r.uniform(0, 4)), f"drawn case {i}"))
        every = cases + drawn
        if not unseparated([_share(p, v, k) for p, v, k, _ in every],
                           [_share_mistakes(p, v, k) for p, v, k, _ in every], _same_share):
            break
    return cases + drawn


def _same_share(a, b) -> bool:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return a.shape == b.shape and bool(torch.isclose(a, b, rtol=RTOL, atol=ATOL).all())


def _check_share(norm_share, check: Check) -> None:
    cases = _share_cases(check)

    def call(case):
        pattern, values_out, keys, what = case
        B, H, T, _ = pattern.shape
        label = f"pattern {list(pattern.shape)}, values_out {list(values_out.shape)}, keys={keys} ({what})"
        got = as_float64(check.call(norm_share, pattern, values_out, list(keys), label=label),
                         f"what norm_share({label}) returned")
        if got.shape != (H,):
            raise Wrong(f"norm_share({label}): return one share per head, shape [{H}], got shape {list(got.shape)}")
        if torch.isnan(got).any():
            raise Wrong(f"norm_share({label}): a share is NaN: is some mean taken over no queries?")
        return got

    got, raised = answers_until_raised(cases, call)
    cases = cases[:len(got)]
    wants = [torch.as_tensor(check.reference(p.clone(), v.clone(), list(k))).double() for p, v, k, _ in cases]
    if all(_same_share(a, b) for a, b in zip(got, wants)):
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (a, b) in enumerate(zip(got, wants)) if not _same_share(a, b))
    pattern, values_out, keys, what = cases[bad]
    label = f"norm_share(pattern {list(pattern.shape)}, values_out {list(values_out.shape)}, keys={keys} ({what}))"
    missed = consistent_mistake(got, wants, [_share_mistakes(p, v, k) for p, v, k, _ in cases], _same_share)
    if missed:
        raise Wrong(f"{label}: {missed}")
    if ((got[bad] < -1e-9) | (got[bad] > 1 + 1e-9)).any():
        raise Wrong(f"{label}: a share lies outside [0, 1]: {got[bad].tolist()}")
    raise Wrong(f"{label} gives {[round(x, 4) for x in got[bad].tolist()]}, not the share of each query's weighted "
                "norms a_qk ||f(x_k)|| that goes to the given keys, averaged over the other queries and the batch")


register(Exercise(
    "08", 2, "how much of a head's output comes from [CLS] and [SEP]?",
    _check_share,
    hint=["values_out[b, k, h] is f(x_k), what key k sends through head h. Its norm over the last axis is "
          "[B, T, H]; permute it to [B, H, T] and put it where the keys are, pattern[b, h, q, k], to get every "
          "term a_qk ||f(x_k)|| as [B, H, T, T].",
          "Per query: the terms on the given keys summed, over all its terms summed. Then keep the queries that are "
          "not among keys and average over them and over the batch, one number per head. A value_out of all ones "
          "gives the weight share: a quick test of your function."],
    solution=(
        "def norm_share(pattern, values_out, keys):\n"
        "    # pattern [B, H, T, T] (query, key); values_out [B, T, H, D]: f(x_k) of each key, head by head -> [H]\n"
        "    sends = values_out.norm(dim=-1).permute(0, 2, 1)       # [B, T, H] -> [B, H, T]: ||f(x_k)||\n"
        "    terms = pattern * sends[:, :, None, :]                  # [B, H, T, T]: a_qk ||f(x_k)||\n"
        "    share = terms[..., keys].sum(-1) / terms.sum(-1)        # [B, H, T]: each query's share\n"
        "    others = [q for q in range(pattern.shape[-1]) if q not in keys]\n"
        "    return share[..., others].mean(dim=(0, 2))             # [H]: over the other queries and the batch"
    ),
    minutes=20, difficulty=3, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 3
def _nearest_first(max_offset: int) -> list[int]:
    return [k for d in range(1, max_offset + 1) for k in (-d, d)]  # -1, 1, -2, 2, ...: the tie order


def _best_offset(pattern: torch.Tensor, max_offset: int, *, inner=True, queries_inner=True, edges="skip",
                 flip=False, order="nearest", zero=False, inclusive=True, reduce="mean", batch="all",
                 heads="each", tie="first", index=False) -> tuple[tuple[int, ...], torch.Tensor]:
    """(each head's best offset, its mean weight) (the checker's own reading, for drawing cases; the answer is the
    solution's), and with options, the readings a learner could make instead."""
    P = pattern.double()
    B, H, T, _ = P.shape
    lo, hi = (1, T - 2) if inner else (0, T - 1)  # the positions that count, as keys (and as queries)
    q_lo, q_hi = (lo, hi) if queries_inner else (0, T - 1)
    K = max_offset if inclusive else max_offset - 1
    ks = _nearest_first(K) if order == "nearest" else [k for k in range(-K, K + 1) if k]
    if zero:
        ks = [0] + ks if order == "nearest" else sorted(ks + [0])
    q = torch.arange(T)
    best_k, best_m = [0] * H, [-math.inf] * H
    for i, k in enumerate(ks):
        key = q - k if flip else q + k
        valid = (q >= q_lo) & (q <= q_hi) & (key >= lo) & (key <= hi)
        if not valid.any():
            continue
        w = P[:, :, q[valid], key[valid]]  # [B, H, queries with a key at k]
        if batch == "first":
            w = w[:1]
        mean = {"mean": w.mean(dim=(0, 2)), "sum": w.sum(2).mean(0),
                "all queries": w.sum(2).mean(0) / (q_hi - q_lo + 1)}[edges if edges != "skip" else reduce]
        if heads == "mean":
            mean = mean.mean().expand(H)
        for h in range(H):
            m = float(mean[h])
            if m > best_m[h] or (tie == "last" and m == best_m[h]):
                best_k[h], best_m[h] = (i if index else k), m
    return tuple(best_k), torch.tensor(best_m, dtype=torch.float64)


def _offset_mistakes(pattern: torch.Tensor, max_offset: int) -> dict[str, tuple]:
    """{message: what that reading returns} for one case."""
    read = lambda **how: _best_offset(pattern, max_offset, **how)  # noqa: E731
    return {
        "[CLS] and [SEP] count neither as queries nor as keys: only the real tokens between them (positions 1 to "
        "T - 2)": read(inner=False),
        "[CLS] and [SEP] do not count as queries either: a query is one of the real tokens 1 to T - 2":
            read(queries_inner=False),
        "a query without a key at offset k (near the sentence's ends) does not count: the mean runs over the queries "
        "that have one, not over every query with 0 for the missing": read(edges="all queries"),
        "that is the sum over the queries; the score is their mean (over the queries that have a key at offset k)":
            read(reduce="sum"),
        "offset k means that the query attends to the key at query + k: -1 is the previous token, +1 the next":
            read(flip=True),
        "on a tie, the nearest offset wins, and of -k and +k the previous (-k): you took the most negative offset "
        "first": read(order="range"),
        "on a tie, the offset met first in the order -1, +1, -2, +2, ... wins: you kept the last of the tied ones":
            read(tie="last"),
        "the offsets run from -max_offset to +max_offset, both ends included": read(inclusive=False),
        "offset 0 (the token itself) is not one of the offsets": read(zero=True),
        "that is the first sequence of the batch only; average over the batch too": read(batch="first"),
        "the mean also runs over the heads, so every head gets the same offset; average over the batch and the "
        "queries only, one offset per head": read(heads="mean"),
        "return the offset k itself (-1 for the previous token), not its position in your list of offsets":
            read(index=True),
    }


def _planted(g: torch.Generator, B: int, T: int, plan: list) -> torch.Tensor:
    """[B, H, T, T] random attention, one head per entry of ``plan``: (offset or None, strength, [CLS] sink
    strength). An offset's key gets the strength added to its score, [CLS] (key 0) the sink's."""
    scores = torch.randn(B, len(plan), T, T, generator=g)
    q = torch.arange(T)
    for h, (k, strength, sink) in enumerate(plan):
        if k is not None:
            valid = (q + k >= 0) & (q + k < T)
            scores[:, h, q[valid], q[valid] + k] += strength
        scores[:, h, :, 0] += sink
    return scores.softmax(-1)


def _rows(T: int, weights: dict) -> torch.Tensor:
    """[T, T] attention whose query q puts weights[k] on key q + k for every real key (1 to T - 2), and what is left
    of its row on [CLS] (key 0): multiples of 1/64, so that tied means are tied exactly."""
    A = torch.zeros(T, T)
    for q in range(T):
        for k, w in weights.items():
            if 1 <= q + k <= T - 2 and 1 <= q <= T - 2:
                A[q, q + k] += w
        A[q, 0] += 1 - A[q].sum()
    return A


def _clear(pattern: torch.Tensor, max_offset: int) -> bool:
    """Whether each head's best mean beats its runner-up by more than rounding (1e-4), so that a correct float32
    answer cannot pick another offset."""
    inner = pattern[..., 1:-1, 1:-1].double()  # [B, H, L, L]: the real tokens
    means = torch.stack([inner.diagonal(k, -2, -1).mean(dim=(0, 2)) for k in _nearest_first(max_offset)
                         if abs(k) < inner.size(-1)])  # [offsets, H]
    top = means.topk(2, dim=0).values if means.size(0) > 1 else means
    return means.size(0) < 2 or bool((top[0] - top[1] > 1e-4).all())


def _clear_draw(draw, max_offset: int) -> torch.Tensor:
    """``draw()`` again until its pattern is :func:`_clear` (a few times at most)."""
    for _ in range(50):
        pattern = draw()
        if _clear(pattern, max_offset):
            break
    return pattern


def _offset_cases(check: Check) -> list[tuple[torch.Tensor, int, str]]:
    g = check.generator(8)
    ties = torch.stack([_rows(8, {-1: 0.25, 1: 0.25}),      # -1 and +1 tie: the previous token wins
                        _rows(8, {1: 0.25, -2: 0.25}),      # +1 and -2 tie: the nearer wins
                        torch.full((8, 8), 1 / 8)])[None]   # every offset ties: -1
    edge = _rows(7, {-1: 0.5})
    edge[1] = 0
    edge[1, 5] = 1.0  # the first real token's only key 4 to the right: one query, with all of its weight there
    edges = _clear_draw(lambda: torch.stack([edge, _planted(g, 1, 7, [(2, 2.0, 0.0)])[0, 0]])[None], 6)
    batch = _clear_draw(lambda: torch.cat([_planted(g, 1, 6, [(-1, 4.0, 0.0), (1, 3.0, 1.0)]),
                                           _planted(g, 2, 6, [(1, 4.0, 0.0), (-1, 3.0, 1.0)])]), 1)
    sinks = torch.stack([_rows(9, {1: 0.125, -1: 0.0625}), _rows(9, {-1: 0.125, 2: 0.09375})])[None]
    six = _clear_draw(lambda: _planted(g, 2, 11, [(-1, 4.0, 1.0), (1, 3.0, 0.0), (-2, 4.0, 2.0), (3, 5.0, 0.0),
                                                  (None, 0.0, 4.0), (0, 5.0, 0.0)]), 3)
    cases = [
        (six, 3, "six heads, two sentences, offsets up to 3"),
        (ties.float(), 3, "ties"),
        (edges.float(), 6, "a sentence of 5 real tokens, offsets up to 6"),
        (batch, 1, "three sentences, offsets up to 1"),
        (sinks.float(), 2, "heads that put most of their weight on [CLS]"),
    ]
    if check.grading:
        r = check.rng(70)
        for i in range(2):
            B, T, K = r.randint(1, 3), r.randint(6, 14), r.randint(1, 5)
            plan = [(r.choice([None, 0] + _nearest_first(K + 1)), r.uniform(1, 5), r.choice([0.0, 2.0, 4.0]))
                    for _ in range(r.randint(1, 5))]
            cases.append((_clear_draw(lambda: _planted(g, B, T, plan), K), K, f"drawn case {i}"))
    return cases


def _same_offsets(a: tuple, b: tuple) -> bool:
    """(offsets, means) alike: the same offsets, and means within the tolerance."""
    return ([int(k) for k in a[0]] == [int(k) for k in b[0]]
            and bool(torch.isclose(torch.as_tensor(a[1]).double(), torch.as_tensor(b[1]).double(), rtol=RTOL,
                                   atol=ATOL).all()))


def _check_offsets(best_offset, check: Check) -> None:
    cases = _offset_cases(check)

    def call(case):
        pattern, K, what = case
        B, H, T, _ = pattern.shape
        label = f"pattern [{B}, {H}, {T}, {T}] ({what}), max_offset={K}"
        got = check.call(best_offset, pattern, K, label=label)
        if isinstance(got, (tuple, list)) and len(got) == 2:
            offsets, means = got
        elif hasattr(got, "shape") and tuple(got.shape) == (2, H):  # torch.stack([offsets, means])
            offsets, means = got[0], got[1]
        else:
            raise Wrong(f"best_offset({label}): return a pair (offsets, means), each with one entry per head, got "
                        f"{describe(got)}")
        offsets, means = as_float64(offsets, "the offsets"), as_float64(means, "the means")
        for value, name in ((offsets, "the offsets"), (means, "the means")):
            if value.shape != (H,):
                raise Wrong(f"best_offset({label}): {name} should have one entry per head, shape [{H}], got shape "
                            f"{list(value.shape)}")
        if torch.isnan(means).any():
            raise Wrong(f"best_offset({label}): a mean is NaN: an offset that no query has (|k| >= T - 2: the real "
                        "tokens are T - 2) has no mean; leave it out")
        if not torch.equal(offsets, offsets.round()):
            raise Wrong(f"best_offset({label}): the offsets should be whole numbers, got fractional values")
        return tuple(int(k) for k in offsets), means

    got, raised = answers_until_raised(cases, call)
    cases = cases[:len(got)]
    wants = []
    for pattern, K, _ in cases:
        offsets, means = check.reference(pattern.clone(), K)
        wants.append((tuple(int(k) for k in torch.as_tensor(offsets)), torch.as_tensor(means).double()))
    if all(_same_offsets(a, b) for a, b in zip(got, wants)):
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (a, b) in enumerate(zip(got, wants)) if not _same_offsets(a, b))
    pattern, K, what = cases[bad]
    B, H, T, _ = pattern.shape
    label = f"best_offset(pattern [{B}, {H}, {T}, {T}] ({what}), max_offset={K})"
    missed = consistent_mistake(got, wants, [_offset_mistakes(p, k) for p, k, _ in cases], _same_offsets)
    if missed:
        raise Wrong(f"{label}: {missed}")
    (offsets, means), (right, right_means) = got[bad], wants[bad]
    h = next(h for h in range(H) if offsets[h] != right[h] or not torch.isclose(means[h], right_means[h],
                                                                                 rtol=RTOL, atol=ATOL))
    if offsets[h] == right[h]:
        raise Wrong(f"{label}: head {h}'s offset is right, but its mean is off ({float(means[h]):.4g}): the mean "
                    "weight from each real token to the real token k away, over the batch and over the queries that "
                    "have such a key")
    raise Wrong(f"{label}: head {h} gets offset {offsets[h]} (mean {float(means[h]):.4g}), but another offset has a "
                "higher mean weight, or the same with a nearer offset")


register(Exercise(
    "08", 3, "the best fixed offset of every head",
    _check_offsets,
    hint=["Drop [CLS] and [SEP] first: pattern[..., 1:-1, 1:-1] is the real tokens' attention, [B, H, L, L]. In it, "
          "query q's weight on the key k away is entry [q, q + k]: which diagonal is that, and how long is it?",
          "torch.diagonal(inner, offset=k, dim1=-2, dim2=-1) is [B, H, L - |k|]: exactly the queries that have a key "
          "at k (empty when |k| >= L: skip those). For the ties, try the offsets in the order -1, +1, -2, +2, ... "
          "and let a later offset replace a head's best only when its mean is strictly higher."],
    solution=(
        "def best_offset(pattern, max_offset):\n"
        "    # pattern: [B, H, T, T], position 0 [CLS], T - 1 [SEP] -> offsets [H], means [H]\n"
        "    inner = pattern[..., 1:-1, 1:-1].double()                # [B, H, L, L]: the real tokens only\n"
        "    L, H = inner.shape[-1], inner.shape[1]\n"
        "    best = torch.zeros(H, dtype=torch.long)\n"
        "    best_mean = torch.full((H,), -1.0, dtype=torch.float64)\n"
        "    for d in range(1, max_offset + 1):\n"
        "        for k in (-d, d):                                     # nearer first, the previous side first\n"
        "            if d >= L:                                        # no query has a key this far away\n"
        "                continue\n"
        "            mean = inner.diagonal(k, -2, -1).mean(dim=(0, 2))  # [H]: inner[q, q + k], queries that have one\n"
        "            higher = mean > best_mean                         # strictly: a tie keeps the nearer offset\n"
        "            best[higher], best_mean[higher] = k, mean[higher]\n"
        "    return best, best_mean"
    ),
    minutes=15, difficulty=3, importance=3,
))
