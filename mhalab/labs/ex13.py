"""Exercise of notebook 13 (lookups at every width): predict which stored keys no width-one head can ever make its
favourite, whatever its query (ties, equal numbers and a lone key included)."""

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


def _sole(k: torch.Tensor, extreme: torch.Tensor) -> torch.Tensor:
    """[H, P]: True where key j is the only one at its head's ``extreme`` ([H, 1]): that head's favourite."""
    at = k == extreme
    return at & (at.sum(1, keepdim=True) == 1)


def _never(k: torch.Tensor) -> torch.Tensor:
    """The keys no head can make its favourite (the checker's own reading, for drawing cases; the answer is the
    solution's)."""
    top, bottom = k.amax(1, keepdim=True), k.amin(1, keepdim=True)
    return ~(_sole(k, top) | _sole(k, bottom)).any(0)


def _mistakes(k: torch.Tensor) -> dict[str, torch.Tensor]:
    """{what a plausible mistake missed: what it returns} for one k [H, P]; each [P], bool."""
    H, P = k.shape
    top, bottom = k.amax(1, keepdim=True), k.amin(1, keepdim=True)
    out = {
        "you marked the keys some head *can* favour: the question is the opposite, the keys no head ever favours":
            ~_never(k),
        "a head whose query is negative favours the *smallest* key (the score q k_j falls as k_j grows): a row's "
        "smallest key is within reach too": ~_sole(k, top).any(0),
        "a head whose query is positive favours the *largest* key: a row's largest key is within reach too":
            ~_sole(k, bottom).any(0),
        "keys that tie for a row's largest (or smallest) number get the same weight whatever the query: neither gets "
        "more than the other, so that head favours neither":
            ~((k == top) | (k == bottom)).any(0),
        "argmax and argmin pick one of tied keys, but tied keys get the same weight: a head whose largest (or "
        "smallest) number is shared favours none of them there":
            ~_marked(P, k.argmax(1), k.argmin(1)),
        "one head is enough: a key is within reach if *some* head favours it, not only if every head does":
            ~(_sole(k, top) | _sole(k, bottom)).all(0),
        "each head has its own numbers: take the largest and the smallest of each row of k, not of the whole table":
            ~_marked(P, int(k.argmax()) % P, int(k.argmin()) % P),
        "the heads are not averaged: each head (each row of k) favours its own largest or smallest key":
            ~_marked(P, k.mean(0).argmax(), k.mean(0).argmin()),
        "no stored key is out of reach of every head: each head can favour the largest or the smallest key of its "
        "row, so at most 2 of its keys, and a key that is neither in any row is never anyone's favourite":
            torch.zeros(P, dtype=torch.bool),
        "a key is never favoured when it is neither the largest nor the smallest of any row: keys in the middle of "
        "every row are out of reach, the extremes are not": torch.ones(P, dtype=torch.bool),
    }
    if H <= P:  # extremes over the heads (dim 0): [P] positions below H (more heads than keys: out of range)
        out["k is [H, P], heads first: each head's extremes are over its P keys (dim 1), not over the heads"] = \
            ~_marked(P, k.argmax(0), k.argmin(0))
    return out


def _never_cases(check: Check) -> list[tuple[torch.Tensor, str]]:
    g = check.generator(12)
    cases = [
        # first a square case where mixing up heads and keys gives the right shape and a wrong answer
        (torch.tensor([[0.0, 1.0, 2.0], [0.2, 1.2, 2.2], [0.1, 1.1, 2.1]]), "3 heads, 3 stored keys"),
        (torch.randn(3, 8, generator=g), "3 heads, 8 stored keys"),
        (torch.tensor([[3.0, 1.0, 3.0, 2.0, 0.0], [1.0, 1.0, 2.0, 1.5, 1.2]]),
         "2 heads, 5 keys: a tie for the largest in one head, for the smallest in the other"),
        (torch.randn(1, 5, generator=g), "one head, 5 stored keys"),
        (torch.tensor([[2.0, 2.0, 2.0, 2.0], [0.5, -1.0, 0.25, 3.0]]), "2 heads, one of them with equal numbers"),
        (torch.tensor([[0.7], [-0.2], [1.5]]), "3 heads, one stored key"),
        (torch.randn(5, 2, generator=g), "5 heads, 2 stored keys"),
        (torch.tensor([[1.0, 1.0], [4.0, 4.0]]), "2 heads, 2 stored keys tied in both"),
        (torch.randn(4, 4, generator=g) - 2.0, "4 heads, 4 stored keys, all negative"),
        (torch.randint(0, 3, (6, 7), generator=g).float(), "6 heads, 7 stored keys, whole numbers 0 to 2 (ties)"),
        (torch.randn(32, 8, generator=g), "32 heads, 8 stored keys"),
        (torch.tensor([[0.5, -1.0, 2.0, 0.1, 1.5, -0.3], [0.4, -2.0, 0.1, 3.0, 0.2, 0.0]]),
         "2 heads, 6 stored keys"),
    ]
    if check.grading:  # three drawn fresh, again a few times at most until every mistake gives its own keys
        for attempt in range(20):
            r = check.rng(121 + 1000 * attempt)
            drawn = []
            for i in range(3):
                H, P = r.randint(1, 40), r.randint(2, 20)
                k = (torch.randint(0, r.randint(2, 5), (H, P), generator=g).float() if i == 0
                     else torch.randn(H, P, generator=g))
                drawn.append((k, f"drawn case {i}: {H} heads, {P} stored keys" + (" (ties)" if i == 0 else "")))
            every = cases + drawn
            if not unseparated([_never(k) for k, _ in every], [_mistakes(k) for k, _ in every], _same):
                break
        cases += drawn
    return cases


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _check_never(never_favourite, check: Check) -> None:
    cases, got, raised = _never_cases(check), [], None
    for k, what in cases:
        H, P = k.shape
        label = f"k of shape [{H}, {P}] ({what})"
        try:
            value = check.call(never_favourite, k, label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if isinstance(value, (list, tuple)):   # a list of booleans is an answer too: read it as a tensor
            value = _as_tensor(value, f"what never_favourite({label}) returned")
        if not hasattr(value, "shape"):
            raise Wrong(f"return a tensor of {P} booleans (or a list or an array), one per stored key, got "
                        f"{describe(value)} for {label}")
        if list(value.shape) == [H] and H != P:
            raise Wrong(f"for {label} you returned {H} values, one per head: return one per stored key ({P}); "
                        "a key is out of reach only if *no* head favours it")
        expect_shape(value, [P], f"what never_favourite({label}) returned")
        value = _as_tensor(value, "your answer")
        if value.dtype != torch.bool:
            if not bool(((value == 0) | (value == 1)).all()):
                raise Wrong(f"return True/False per stored key, got values {value.tolist()} for {label}")
            value = value.bool()
        got.append(value)
    cases = cases[:len(got)]
    wants = [torch.as_tensor(check.reference(k)).bool() for k, _ in cases]
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
                "(a key is out of reach when no head, whatever its query, gives it more weight than every other key)")


register(Exercise(
    "13", 1, "the keys no width-one head can favour",
    _check_never,
    hint=["Take one head (one row of k) and let its query q run over every real number: the weights are a softmax "
          "of q k_j. Which key gets the most weight when q > 0, when q < 0, when q = 0? What if two keys share the "
          "row's largest number, or every number of the row is the same?",
          "A head favours a key only if that key alone holds its row's largest or its row's smallest number. A key "
          "is out of reach if no row does that for it. Return a boolean tensor of shape [P]."],
    solution=(
        "def never_favourite(k):\n"
        "    # k: [H, P] one key number per width-one head, for each of the P stored keys\n"
        "    favoured = torch.zeros(k.shape[1], dtype=torch.bool)              # [P]\n"
        "    for extreme in (k.amax(1, keepdim=True), k.amin(1, keepdim=True)):  # q > 0, then q < 0\n"
        "        at = k == extreme                                             # [H, P]\n"
        "        alone = at.sum(1, keepdim=True) == 1                          # [H, 1]: no tie at the extreme\n"
        "        favoured |= (at & alone).any(0)\n"
        "    return ~favoured"
    ),
    minutes=12, difficulty=3, importance=2,
))
