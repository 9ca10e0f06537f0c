"""Exercise of notebook 12 (lookups at every width): which stored keys some width-one head can single out."""

from __future__ import annotations

import torch

from .calls import Check
from .checks import _as_tensor, describe, expect_shape
from .core import Exercise, register
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _extremes(k: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return k.argmax(dim), k.argmin(dim)


def _mistakes(k: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """(what a plausible mistake returns, what it missed); each [P], bool."""
    H, P = k.shape
    only_largest = torch.zeros(P, dtype=torch.bool)
    only_largest[k.argmax(1)] = True
    only_smallest = torch.zeros(P, dtype=torch.bool)
    only_smallest[k.argmin(1)] = True
    every_head = ((k == k.amax(1, keepdim=True)) | (k == k.amin(1, keepdim=True))).all(0)
    whole_table = torch.zeros(P, dtype=torch.bool)
    whole_table[[int(k.argmax()) % P, int(k.argmin()) % P]] = True
    wrong_dim = torch.zeros(P, dtype=torch.bool)
    per_head = torch.zeros(P, dtype=torch.bool)
    if H == P:  # mixing up the two dimensions gives the right shape only when H == P
        wrong_dim[k.argmax(0)] = True    # extremes over the heads instead of over the keys
        wrong_dim[k.argmin(0)] = True
        per_head[:] = True               # "does this head have an extreme?": always, for every head
    return [
        (only_largest, "a head whose query is negative picks the *smallest* key (the score q*k_j falls as k_j "
                       "grows): mark each head's smallest key too"),
        (only_smallest, "a head whose query is positive picks the *largest* key: mark each head's largest key too"),
        (every_head, "one head is enough: a key is reachable if it is an extreme in *some* head, not in every head"),
        (whole_table, "each head has its own coordinate: take the largest and the smallest key of each head (each "
                      "row of k), not of the whole table"),
        (wrong_dim, "k is [H, P], heads first: each head's extremes are over its P keys (dim 1), not over the heads"),
        (per_head, "you returned one value per head (k is [H, P], heads first): return one per stored key, True "
                   "if some head has it as an extreme"),
    ]


def _reachable_cases(check: Check) -> list[tuple[torch.Tensor, str]]:
    g = check.generator(12)
    # first a square case where mixing up heads and keys gives the right shape and a wrong answer
    cases = [(torch.tensor([[0.0, 1.0, 2.0], [0.2, 1.2, 2.2], [0.1, 1.1, 2.1]]), "3 heads, 3 stored keys"),
             (torch.randn(3, 8, generator=g), "3 heads, 8 stored keys"),
             (torch.randn(1, 5, generator=g), "one head, 5 stored keys"),
             (torch.randn(5, 2, generator=g), "5 heads, 2 stored keys"),
             (torch.randn(4, 4, generator=g) - 2.0, "4 heads, 4 stored keys, all negative"),
             (torch.randn(32, 8, generator=g), "32 heads, 8 stored keys"),
             (torch.tensor([[0.5, -1.0, 2.0, 0.1, 1.5, -0.3], [0.4, -2.0, 0.1, 3.0, 0.2, 0.0]]),
              "2 heads, 6 stored keys")]
    if check.grading:
        r = check.rng(121)
        for i in range(3):
            H, P = r.randint(1, 40), r.randint(2, 20)
            cases.append((torch.randn(H, P, generator=g), f"drawn case {i}: {H} heads, {P} stored keys"))
    return cases


def _check_reachable(reachable_keys, check: Check) -> None:
    for k, what in _reachable_cases(check):
        H, P = k.shape
        label = f"k of shape [{H}, {P}] ({what})"
        got = check.call(reachable_keys, k, label=label)
        if not hasattr(got, "shape"):
            raise Wrong(f"return a tensor of {P} booleans, one per stored key, got {describe(got)} for {label}")
        if list(got.shape) == [H] and H != P:
            raise Wrong(f"for {label} you returned {H} values, one per head: return one per stored key ({P}); "
                        "a key is reachable if *some* head has it as an extreme")
        expect_shape(got, [P], f"what reachable_keys({label}) returned")
        got = _as_tensor(got, "your answer")
        if got.dtype != torch.bool:
            if not bool(((got == 0) | (got == 1)).all()):
                raise Wrong(f"return True/False per stored key, got values {got.tolist()} for {label}")
            got = got.bool()
        want = check.reference(k)
        if torch.equal(got, want):
            continue
        missed = next((message for value, message in _mistakes(k) if torch.equal(got, value)), None)
        if missed:
            raise Wrong(f"for {label}: {missed}")
        j = int((got != want).nonzero()[0])
        raise Wrong(f"for {label}, stored key {j}: you said {bool(got[j])}, the answer is {bool(want[j])} "
                    "(it is reachable exactly when it is the largest or the smallest entry of some row of k)")


register(Exercise(
    "12", 1, "the keys width-one heads can single out",
    _check_reachable,
    hint=["A head of width one gives every stored key one number; k[i] holds head i's numbers for the P keys. "
          "For any query, that head's favourite is the largest or the smallest of its row (notebook 04).",
          "Mark, for every head (row), the position of its largest and of its smallest entry; a key is reachable "
          "if any head marked it. Return a boolean tensor of shape [P]."],
    solution=(
        "def reachable_keys(k):\n"
        "    # k: [H, P] one key coordinate per width-one head, for each of the P stored keys\n"
        "    reachable = torch.zeros(k.shape[1], dtype=torch.bool)    # [P]\n"
        "    reachable[k.argmax(dim=1)] = True                         # each head's largest key\n"
        "    reachable[k.argmin(dim=1)] = True                         # each head's smallest key\n"
        "    return reachable"
    ),
    minutes=15, difficulty=3, importance=2,
))
