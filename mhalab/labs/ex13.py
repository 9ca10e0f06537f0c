"""Exercise of notebook 13 (lookups at every width): which stored keys some width-one head can single out."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import _as_tensor, consistent_mistake, describe, expect_shape, unseparated
from .verdicts import AnswerRaised, Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _marked(P: int, *positions) -> torch.Tensor:
    out = torch.zeros(P, dtype=torch.bool)
    for where in positions:
        out[where] = True
    return out


def _mistakes(k: torch.Tensor) -> dict[str, torch.Tensor]:
    """{what a plausible mistake missed: what it returns} for one k [H, P]; each [P], bool."""
    H, P = k.shape
    out = {
        "a head whose query is negative picks the *smallest* key (the score q*k_j falls as k_j grows): mark each "
        "head's smallest key too": _marked(P, k.argmax(1)),
        "a head whose query is positive picks the *largest* key: mark each head's largest key too":
            _marked(P, k.argmin(1)),
        "one head is enough: a key is reachable if it is an extreme in *some* head, not in every head":
            ((k == k.amax(1, keepdim=True)) | (k == k.amin(1, keepdim=True))).all(0),
        "each head has its own coordinate: take the largest and the smallest key of each head (each row of k), not "
        "of the whole table": _marked(P, int(k.argmax()) % P, int(k.argmin()) % P),
        "the heads are not averaged: each head (each row of k) singles out its own largest and smallest key":
            _marked(P, k.mean(0).argmax(), k.mean(0).argmin()),
        "you marked every stored key reachable: a head of width one can single out only the largest or the "
        "smallest entry of its row, so a key that is neither in any row is out of every head's reach":
            torch.ones(P, dtype=torch.bool),
    }
    if H <= P:  # extremes over the heads (dim 0): [P] positions below H (more heads than keys: out of range)
        out["k is [H, P], heads first: each head's extremes are over its P keys (dim 1), not over the heads"] = \
            _marked(P, k.argmax(0), k.argmin(0))
    return out


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
    if check.grading:  # three drawn fresh, again a few times at most until every mistake gives its own keys
        for attempt in range(20):
            r = check.rng(121 + 1000 * attempt)
            drawn = []
            for i in range(3):
                H, P = r.randint(1, 40), r.randint(2, 20)
                drawn.append((torch.randn(H, P, generator=g), f"drawn case {i}: {H} heads, {P} stored keys"))
            right = [_reachable(k) for k, _ in cases + drawn]
            if not unseparated(right, [_mistakes(k) for k, _ in cases + drawn], _same):
                break
        cases += drawn
    return cases


def _reachable(k: torch.Tensor) -> torch.Tensor:
    """The reachable keys (the checker's own reading, for drawing cases; the answer is the solution's)."""
    return _marked(k.shape[1], k.argmax(1), k.argmin(1))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _check_reachable(reachable_keys, check: Check) -> None:
    cases, got, raised = _reachable_cases(check), [], None
    for k, what in cases:
        H, P = k.shape
        label = f"k of shape [{H}, {P}] ({what})"
        try:
            value = check.call(reachable_keys, k, label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if not hasattr(value, "shape"):
            raise Wrong(f"return a tensor of {P} booleans, one per stored key, got {describe(value)} for {label}")
        if list(value.shape) == [H] and H != P:
            raise Wrong(f"for {label} you returned {H} values, one per head: return one per stored key ({P}); "
                        "a key is reachable if *some* head has it as an extreme")
        expect_shape(value, [P], f"what reachable_keys({label}) returned")
        value = _as_tensor(value, "your answer")
        if value.dtype != torch.bool:
            if not bool(((value == 0) | (value == 1)).all()):
                raise Wrong(f"return True/False per stored key, got values {value.tolist()} for {label}")
            value = value.bool()
        got.append(value)
    cases = cases[:len(got)]
    wants = [check.reference(k).bool() for k, _ in cases]
    if all(_same(g, w) for g, w in zip(got, wants)):
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if not _same(g, w))
    k, what = cases[bad]
    label = f"k of shape [{k.shape[0]}, {k.shape[1]}] ({what})"
    missed = consistent_mistake(got, wants, [_mistakes(k) for k, _ in cases], _same)
    if missed:
        raise Wrong(f"for {label}: {missed}")
    j = int((got[bad] != wants[bad]).nonzero()[0])
    raise Wrong(f"for {label}, stored key {j}: you said {bool(got[bad][j])}, the answer is {bool(wants[bad][j])} "
                "(it is reachable exactly when it is the largest or the smallest entry of some row of k)")


register(Exercise(
    "13", 1, "the keys width-one heads can single out",
    _check_reachable,
    hint=["A head of width one gives every stored key one number; k[i] holds head i's numbers for the P keys. "
          "For any query, that head's favourite is the largest or the smallest of its row (notebook 05).",
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
