"""Exercises of notebook 04 (what more heads really cost): the limits of a head of width d_k, where a
width-one head can look, and choosing a head count for a width."""

from __future__ import annotations

import torch

from .checks import as_float64, call_answer, expect_whole, largest_tensor, observe
from .core import Exercise, Wrong, register


# ------------------------------------------------------------------------------------ exercise 1
_LIMIT_CASES = [(768, 12, 1000), (512, 64, 4), (96, 32, 10), (64, 1, 16), (4096, 32, 2048), (48, 48, 7)]


def _check_limits(head_limits) -> None:
    for d_model, n_heads, seq_len in _LIMIT_CASES:
        case = f"d_model={d_model}, n_heads={n_heads}, seq_len={seq_len}"
        got = call_answer(head_limits, d_model, n_heads, seq_len, label=case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"return a pair (d_k, largest possible rank of one head's score matrix); for {case} you returned {got!r}"[:300])
        d_k, rank = expect_whole(got[0], f"d_k for {case}"), expect_whole(got[1], f"the rank bound for {case}")
        want_dk = d_model // n_heads
        if d_k != want_dk:
            if d_k == d_model:
                raise Wrong(f"d_k for {case} is the whole width; each head gets an equal share of d_model")
            raise Wrong(f"d_k for {case} is off: it is the width of one head when d_model is shared by n_heads")
        if rank == min(want_dk, seq_len):
            continue
        if rank == want_dk:
            raise Wrong(f"the rank bound for {case} ignores seq_len: Q K^T is seq_len x seq_len, so its rank "
                        "cannot exceed seq_len either")
        if rank == seq_len:
            raise Wrong(f"the rank bound for {case} ignores d_k: Q is [seq_len, d_k], K^T is [d_k, seq_len], "
                        "and a product has no more rank than its inner dimension")
        if rank == min(d_model, seq_len):
            raise Wrong(f"the rank bound for {case} uses the model width; one head's scores come from its own "
                        "d_k-wide queries and keys")
        raise Wrong(f"the rank bound for {case} is off: think of Q K^T as a [seq_len, d_k] @ [d_k, seq_len] product")


register(Exercise(
    "04", 1, "predict d_k and the rank bound",
    _check_limits,
    hint=["One head's scores are Q K^T with Q and K of shape [seq_len, d_k].",
          "rank(A @ B) <= min(rank A, rank B), and a [seq_len, d_k] matrix has rank at most min(seq_len, d_k)."],
    solution=(
        "def head_limits(d_model, n_heads, seq_len):\n"
        "    d_k = d_model // n_heads\n"
        "    return d_k, min(d_k, seq_len)   # Q K^T = [seq_len, d_k] @ [d_k, seq_len]"
    ),
    reference=lambda d_model, n_heads, seq_len: (d_model // n_heads, min(d_model // n_heads, seq_len)),
))


# ------------------------------------------------------------------------------------ exercise 2
def _favourite_reference(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.where(q > 0, k.argmax(), k.argmin())


def _favourite_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    cases = []
    for L, S in [(50, 70), (12, 12), (1, 30), (40, 3)]:
        q = torch.randn(L, generator=g)
        q[q.abs() < 0.05] = 0.5  # no query near zero (a zero query weighs every key equally)
        cases.append((q, torch.randn(S, generator=g) * 3))
    q = torch.tensor([2.0, -1.0, 0.5, -3.0])  # mixed signs, so "always the largest key" fails
    cases.append((q, torch.tensor([0.3, -2.0, 1.5, 0.1, -0.4])))
    return cases


def _check_favourite(favourite_keys) -> None:
    for q, k in _favourite_cases():
        L, S = len(q), len(k)
        case = f"q of {L} queries ({int((q < 0).sum())} negative), k of {S} keys"
        got = as_float64(call_answer(favourite_keys, q, k, label=case), f"what favourite_keys({case}) returned")
        largest = observe(largest_tensor)
        if got.shape != (L,):
            raise Wrong(f"return one key position per query, a tensor of shape [{L}], got shape {list(got.shape)} for {case}")
        if not torch.equal(got, got.round()):
            raise Wrong(f"return key *positions* (whole numbers), got fractional values for {case}")
        want = _favourite_reference(q, k)
        bad = got.long() != want
        if bad.any():
            i = int(bad.nonzero()[0])
            sign = "negative" if q[i] < 0 else "positive"
            raise Wrong(f"for {case}, query {i} (its q is {sign}) gets the wrong key: for a fixed query the score "
                        "q*k_j is a straight line in k_j; which end of the keys does its slope favour?")
        if L * S > 2 * max(L, S) and largest >= L * S:
            raise Wrong(f"right positions, but for {case} your function built a tensor of {largest:,} entries, as many "
                        f"as the {L} x {S} score matrix; the exercise asks for an answer that never builds it")


register(Exercise(
    "04", 2, "where a width-one head can look",
    _check_favourite,
    hint=["With d_k = 1 query i scores key j as q_i * k_j (two numbers). For a fixed i, how does the score "
          "change as k_j grows?",
          "If q_i > 0 the biggest k_j wins; if q_i < 0 the smallest. So every query picks one of just two keys."],
    solution=(
        "def favourite_keys(q, k):\n"
        "    # q: [L] one number per query, k: [S] one number per key (a head with d_k = 1)\n"
        "    return torch.where(q > 0, k.argmax(), k.argmin())   # [L]: positive queries take the largest key"
    ),
    reference=_favourite_reference,
))


# ------------------------------------------------------------------------------------ exercise 3
def _choose_reference(d_model: int, n_relations: int, min_d_k: int) -> int:
    for h in range(n_relations, d_model + 1):
        if d_model % h == 0:
            if d_model // h < min_d_k:
                break
            return h
    raise ValueError(f"no head count gives {n_relations} heads of width >= {min_d_k} at d_model={d_model}")


_CHOOSE_CASES = [(64, 4, 2), (64, 3, 2), (96, 5, 8), (48, 7, 4), (512, 8, 64), (30, 4, 3), (12, 1, 12)]
_IMPOSSIBLE = [(8, 4, 4), (64, 3, 32), (10, 3, 3)]


def _check_choose(choose_heads) -> None:
    for d_model, n_relations, min_d_k in _CHOOSE_CASES:
        case = f"d_model={d_model}, n_relations={n_relations}, min_d_k={min_d_k}"
        h = expect_whole(call_answer(choose_heads, d_model, n_relations, min_d_k, label=case), f"the head count for {case}")
        if h < 1 or d_model % h:
            raise Wrong(f"for {case} your head count does not divide d_model, so d_k = d_model / h is not whole")
        if h < n_relations:
            raise Wrong(f"for {case} there are fewer heads than relations: some head must blend two roles")
        if d_model // h < min_d_k:
            raise Wrong(f"for {case} your heads are narrower than min_d_k: too thin for the job")
        if h != _choose_reference(d_model, n_relations, min_d_k):
            raise Wrong(f"for {case} a head count with fewer, wider heads also gives every relation its own head: "
                        "take the smallest head count that works")
    for d_model, n_relations, min_d_k in _IMPOSSIBLE:
        case = f"d_model={d_model}, n_relations={n_relations}, min_d_k={min_d_k}"
        try:
            h = call_answer(choose_heads, d_model, n_relations, min_d_k, label=case, allow=(ValueError,))
        except ValueError:
            continue
        raise Wrong(f"for {case} no head count satisfies both rules, but your function returned {h!r}; "
                    "raise ValueError saying why instead")


register(Exercise(
    "04", 3, "choose a head count for a width",
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
    reference=_choose_reference,
))
