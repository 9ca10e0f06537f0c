"""Exercises of notebook 04 (what more heads really cost): the limits of a head of width d_k, where a
width-one head can look, and choosing a head count for a width."""

from __future__ import annotations

from numbers import Integral

import torch

from .core import Exercise, Wrong, register


def _whole(value, what: str, case: str) -> int:
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise Wrong(f"{what} should be a whole number, got {type(value).__name__} ({value!r}) for {case}")
    return int(value)


# ------------------------------------------------------------------------------------ exercise 1
_LIMIT_CASES = [(768, 12, 1000), (512, 64, 4), (96, 32, 10), (64, 1, 16), (4096, 32, 2048), (48, 48, 7)]


def _check_limits(head_limits) -> None:
    for d_model, n_heads, seq_len in _LIMIT_CASES:
        case = f"d_model={d_model}, n_heads={n_heads}, seq_len={seq_len}"
        got = head_limits(d_model, n_heads, seq_len)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"return a pair (d_k, largest possible rank of one head's score matrix), got {got!r} for {case}")
        d_k, rank = (_whole(v, name, case) for v, name in zip(got, ("d_k", "the rank bound")))
        want_dk = d_model // n_heads
        if d_k != want_dk:
            if d_k == d_model:
                raise Wrong(f"d_k for {case} is the whole width; each head gets an equal share of d_model")
            raise Wrong(f"d_k for {case} is off: it is the width of one head when d_model is shared by n_heads")
        want_rank = min(want_dk, seq_len)
        if rank != want_rank:
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
    wrong=[
        lambda d_model, n_heads, seq_len: (d_model // n_heads, d_model // n_heads),  # forgot seq_len
        lambda d_model, n_heads, seq_len: (d_model // n_heads, seq_len),  # forgot d_k
        lambda d_model, n_heads, seq_len: (d_model, min(d_model, seq_len)),  # whole width
    ],
))


# ------------------------------------------------------------------------------------ exercise 2
def _favourite_reference(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.where(q > 0, k.argmax(), k.argmin())


def _favourite_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    cases = []
    for L, S in [(5, 7), (12, 12), (1, 30), (40, 3)]:
        q = torch.randn(L, generator=g)
        q[q.abs() < 0.05] = 0.5  # no query near zero (a zero query weighs every key equally)
        cases.append((q, torch.randn(S, generator=g) * 3))
    q = torch.tensor([2.0, -1.0, 0.5, -3.0])  # mixed signs, so "always the largest key" fails
    cases.append((q, torch.tensor([0.3, -2.0, 1.5, 0.1, -0.4])))
    return cases


def _check_favourite(favourite_keys) -> None:
    for q, k in _favourite_cases():
        case = f"q of {len(q)} queries ({int((q < 0).sum())} negative), k of {len(k)} keys"
        got = favourite_keys(q.clone(), k.clone())
        got = torch.as_tensor(got)
        if got.shape != (len(q),):
            raise Wrong(f"return one key position per query, a tensor of shape [{len(q)}], got shape "
                        f"{list(got.shape)} for {case}")
        if got.is_floating_point() and not torch.equal(got, got.round()):
            raise Wrong(f"return key *positions* (whole numbers), got fractional values for {case}")
        got = got.long()
        want = _favourite_reference(q, k)
        brute = (q[:, None] * k[None, :]).softmax(-1).argmax(-1)  # what the full pattern says
        assert torch.equal(want, brute)
        bad = got != want
        if bad.any():
            i = int(bad.nonzero()[0])
            sign = "negative" if q[i] < 0 else "positive"
            raise Wrong(f"for {case}, query {i} (its q is {sign}) gets the wrong key: for a fixed query the score "
                        "q*k_j is a straight line in k_j; which end of the keys does its slope favour?")


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
    wrong=[
        lambda q, k: k.argmax().expand(len(q)),  # ignores the sign of the query
        lambda q, k: torch.where(q > 0, k.argmin(), k.argmax()),  # signs swapped
        lambda q, k: torch.arange(len(q)) % len(k),  # "each query looks at itself"
    ],
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
        h = _whole(choose_heads(d_model, n_relations, min_d_k), "the head count", case)
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
            h = choose_heads(d_model, n_relations, min_d_k)
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
    wrong=[
        lambda d_model, n_relations, min_d_k: n_relations,  # may not divide d_model, never raises
        lambda d_model, n_relations, min_d_k: d_model,  # as many heads as possible: d_k = 1
        lambda d_model, n_relations, min_d_k: 1,  # one head blends every relation
        lambda d_model, n_relations, min_d_k: max(h for h in range(1, d_model + 1)
                                                  if d_model % h == 0 and d_model // h >= min_d_k),  # narrowest allowed
    ],
))
