"""Exercises of notebook 11 (heads form): predict the in-context-learning score a perfect induction head allows
on a repeated sequence, from the sequence's structure alone; then design the test that tells an induction head
from the heads that look like one (a head that looks a fixed distance back, a head that looks at the earlier copy
itself) and from its previous-token head, on attention patterns.

Both run on hidden cases made up here (sequence sizes whose windows straddle the first repeat; patterns of made-up
heads, with the induction head in any layer from 1 up), drawn fresh when grading and redrawn until every mistake
the checker names gives a result of its own on some case.
"""

from __future__ import annotations

import math

import torch

from .calls import Check
from .core import Exercise, register
from .judging import ATOL, RTOL, as_float64, consistent_mistake, expect_whole, unseparated
from .verdicts import AnswerRaised, Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _floor(V: int, P: int, T: int, w: int, *, first: int | None = None, targets: int | None = None,
           log=math.log) -> float:
    """The score of a perfect induction head: target t (token t + 1, predicted at position t) costs log V before
    position ``first`` (the first whose token occurred before: ``P``), 0 from it on. ``targets``: how many there are
    (T - 1); the keywords give the mistakes."""
    first = P if first is None else first
    n = T - 1 if targets is None else targets
    loss = [log(V) if t < first else 0.0 for t in range(n)]
    return sum(loss[-w:]) / w - sum(loss[:w]) / w


def _floor_mistakes(V: int, P: int, T: int, w: int) -> dict:
    """{message: what that mistake predicts} for one case."""
    right = _floor(V, P, T, w)
    unknown = [t < P for t in range(T - 1)]  # the targets a perfect induction head cannot know
    return {
        "the loss is in nats: ln V (math.log), not log2 V": _floor(V, P, T, w, log=math.log2),
        "the sign is flipped: the score is the late window minus the early one (negative when the context helps)":
            -right,
        "the first repeated token (token `period`) cannot be predicted: at position period - 1 the current token has "
        "not occurred before, so there is no earlier copy whose follower to read":
            _floor(V, P, T, w, first=P - 1),
        "from position `period` on the current token has occurred before, and what followed it then is the next "
        "token: the target at position `period` is already known":
            _floor(V, P, T, w, first=P + 1),
        "there are seq_len - 1 targets (the last token has no next token): the last window ends at target "
        "seq_len - 2": _floor(V, P, T, w, targets=T),
        "the early window is not all guesses when the period is shorter than the window: the targets from position "
        "`period` on are known there too": math.log(V) * (sum(unknown[-w:]) - w) / w,
        "the late window is not all known when the first repeat comes late: targets before position `period` in it "
        "still cost ln V": -math.log(V) * sum(unknown[:w]) / w,
    }


def _floor_cases(check: Check) -> list:
    """(vocab_size, period, seq_len, window): a period far shorter than the sequence; one just shorter, so the
    first repeat falls inside the last window; one shorter than the window, so it falls inside the first; a period
    longer than the sequence (nothing repeats); overlapping windows. Drawn fresh when grading (each kind once)."""
    if not check.grading:
        return [(32, 12, 48, 8), (50, 20, 24, 8), (10, 5, 30, 8), (7, 16, 12, 4), (64, 6, 10, 6)]
    for attempt in range(20):
        r = check.rng(90 + 1000 * attempt)
        cases = []
        w = r.randint(3, 10)
        T = r.randint(4 * w, 6 * w)
        cases.append((r.randint(10, 200), r.randint(w, T // 3), T, w))                  # the late window: all known
        w = r.randint(3, 10)
        T = r.randint(3 * w, 5 * w)
        cases.append((r.randint(10, 200), r.randint(T - w, T - 2), T, w))                # the first repeat: late
        w = r.randint(4, 10)
        cases.append((r.randint(10, 200), r.randint(2, w - 1), r.randint(3 * w, 5 * w), w))  # ...: early
        T = r.randint(6, 20)
        cases.append((r.randint(3, 200), r.randint(T, 2 * T), T, r.randint(2, T // 2)))    # nothing repeats
        w = r.randint(4, 8)
        T = r.randint(w + 2, 2 * w)
        cases.append((r.randint(10, 200), r.randint(2, w), T, w))                         # the windows overlap
        right = [_floor(*c) for c in cases]
        if not unseparated(right, [_floor_mistakes(*c) for c in cases], _same_value):
            break
    return cases


def _same_value(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) <= ATOL + RTOL * abs(b)


def _number(value, name: str) -> float:
    if isinstance(value, (bool, str, list, tuple, dict)) or value is None:
        raise Wrong(f"{name} should be one number (the score, in nats), got {type(value).__name__}")
    got = as_float64(value, name)
    if got.numel() != 1:
        raise Wrong(f"{name} should be one number (the score, in nats), got a tensor of shape {list(got.shape)}")
    return got.item()


def _check_floor(icl_floor, check: Check) -> None:
    cases, got, raised = _floor_cases(check), [], None
    for V, P, T, w in cases:
        label = f"vocab_size={V}, period={P}, seq_len={T}, window={w}"
        try:
            got.append(_number(check.call(icl_floor, V, P, T, w, label=label), f"icl_floor({label})"))
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
    cases = cases[:len(got)]
    wants = [float(check.reference(*c)) for c in cases]
    bad = next((i for i, (g, w) in enumerate(zip(got, wants)) if not _same_value(g, w)), None)
    if bad is None:
        if raised is not None:
            raise raised
        return
    V, P, T, w = cases[bad]
    message = consistent_mistake(got, wants, [_floor_mistakes(*c) for c in cases], _same_value)
    if message is None:
        message = (f"a perfect induction head predicts target t for nothing (ln {V} nats) while the token at "
                   f"position t has not occurred before, and for free once it has; count those targets in each "
                   f"window")
    raise Wrong(f"icl_floor(vocab_size={V}, period={P}, seq_len={T}, window={w}): got {got[bad]:.4g} nats; "
                f"{message}")


register(Exercise(
    "11", 1, "predict the score a perfect induction head allows",
    _check_floor,
    hint=["Write down the loss of every target t = 0 .. seq_len - 2 (target t is token t + 1, predicted at position "
          "t): a perfect induction head knows it exactly when the token at position t occurred before. From which "
          "position on is that so?",
          "At position period - 1 the token is still new (its copy is at 2 * period - 1): target period - 1, the first "
          "repeated token, costs ln V. From position period on every target is free. Average each window of that "
          "list, late minus early."],
    solution=(
        "def icl_floor(vocab_size, period, seq_len, window):\n"
        "    # target t (token t + 1, predicted at position t): known once the token at t occurred before\n"
        "    loss = [math.log(vocab_size) if t < period else 0.0 for t in range(seq_len - 1)]\n"
        "    return sum(loss[-window:]) / window - sum(loss[:window]) / window"
    ),
    minutes=10, difficulty=2, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 2
def _follows(tokens: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """[B, T, T]: key j counts for query i (j < i) when tokens[j - shift] is the query's token (shift 1: j follows
    an earlier copy of it; shift 0: j is one)."""
    B, T = tokens.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    out[:, :, shift:] = tokens[:, :, None] == tokens[:, None, :T - shift]
    return out & torch.ones(T, T, dtype=torch.bool).tril(-1)


def _content(patterns, keys: torch.Tensor) -> torch.Tensor:
    """[N, H]: the attention on ``keys`` ([B, T, T]), averaged over the queries that have such a key."""
    counted = keys.any(-1).double()                                            # [B, T]
    return torch.stack([(p.double() * keys[:, None]).sum(-1).mul(counted[:, None]).sum((0, 2)) / counted.sum()
                        for p in patterns])


def _offset(patterns, d: int) -> torch.Tensor:
    """[N, H]: the mean attention on the key ``d`` back (queries d .. T - 1)."""
    return torch.stack([p.double().diagonal(-d, -2, -1).mean((0, 2)) for p in patterns])


def _argmax(scores: torch.Tensor, layers) -> tuple[int, int] | None:
    layers = list(layers)
    if not layers:
        return None
    at = scores[layers]
    layer, head = divmod(int(at.argmax()), at.size(1))
    return (layers[layer], head)


def _circuit(tokens, patterns, *, induction=None, layers=None, below=None, previous=None):
    """The pair a reading gives: the head with the highest ``induction`` score among ``layers`` (default layers 1
    and up), then the one with the highest ``previous`` score among ``below(its layer)`` (default the layers below
    it). The keywords give the mistakes."""
    N = len(patterns)
    ind = _content(patterns, _follows(tokens)) if induction is None else induction
    head = _argmax(ind, range(1, N) if layers is None else layers)
    prev = _offset(patterns, 1) if previous is None else previous
    return (head, _argmax(prev, range(head[0]) if below is None else below(head[0])))


def _period(tokens: torch.Tensor) -> int:
    """The period of sequence 0: the smallest shift that maps it onto itself."""
    T = tokens.size(1)
    return next(p for p in range(1, T) if torch.equal(tokens[0, p:], tokens[0, :T - p]))


def _circuit_mistakes(tokens, patterns) -> dict:
    """{message: the pair that mistake gives} for one case; a mistake in the induction head gives (head, None)."""
    N = len(patterns)
    ind, prev = _content(patterns, _follows(tokens)), _offset(patterns, 1)   # [N, H] each: the right scores, once
    (il, ih), (pl, ph) = right = _circuit(tokens, patterns, induction=ind, previous=prev)

    def induction_only(pair):  # whichever previous-token head follows from it
        return (pair[0], None)

    return {
        "the pairs are (layer, head), in that order": ((ih, il), (ph, pl)),
        "the induction head comes first, then the previous-token head": (right[1], right[0]),
        "that head looks at the earlier copy of the query's token itself; an induction head looks at the token that "
        "*followed* it (the keys j with tokens[j - 1] equal to the query's token)":
            induction_only(_circuit(tokens, patterns, induction=_content(patterns, _follows(tokens, 0)),
                                    previous=prev)),
        "that head looks a fixed distance back (a positional head): it reads the follower only in the sequences "
        "whose period fits that distance. The sequences of a batch repeat with different periods: test every "
        "sequence by content, the keys that follow an earlier copy of the query's token":
            induction_only(_circuit(tokens, patterns, induction=_offset(patterns, _period(tokens) - 1),
                                    previous=prev)),
        "the induction head need not be in the last layer: look in every layer from 1 up":
            induction_only(_circuit(tokens, patterns, induction=ind, layers=[N - 1], previous=prev)),
        "the previous-token head must sit in a layer *below* the induction head (its keys read what the layer below "
        "wrote)": _circuit(tokens, patterns, induction=ind, previous=prev, below=lambda layer: range(N)),
        "the previous-token head sits in a layer below the induction head, not in its own layer":
            _circuit(tokens, patterns, induction=ind, previous=prev, below=lambda layer: range(layer + 1)),
        "the previous-token head may sit in any layer below the induction head, not only the one just below":
            _circuit(tokens, patterns, induction=ind, previous=prev, below=lambda layer: [layer - 1]),
        "that head attends to the query's own position; a previous-token head attends to the key just before it "
        "(i - 1)": _circuit(tokens, patterns, induction=ind, previous=_offset(patterns, 0)),
    }


def _sequences(g: torch.Generator, r, B: int, T: int, V: int) -> torch.Tensor:
    """[B, T] tokens: each sequence a random block repeated, with its own period; sequence 0 and about a third of
    the others share one period (the one a positional head fits)."""
    periods = r.sample(range(T // 4, T // 2 + 1), 3)
    tokens = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        P = periods[0] if b % 3 == 0 else periods[1 + b % 2]
        block = torch.randperm(V, generator=g)[:P]                             # no token twice in a block
        tokens[b] = block.repeat(T // P + 1)[:T]
    return tokens


def _patterns(g, r, tokens: torch.Tensor, N: int, H: int, il: int, pl: int) -> list:
    """One [B, H, T, T] pattern per layer: random heads, and among them the induction head in layer ``il`` (0.8 on
    the follower of the most recent copy), its previous-token head in layer ``pl`` (0.7 on i - 1), and every head a
    reading can take instead: a positional head at the first sequence's period (1.0), a duplicate-token head
    (0.95 on the copy itself), a weaker induction head in the last layer (on half of the queries), stronger
    previous-token heads in the induction head's layer and above it, a weaker one just below it, a head that
    attends to itself."""
    B, T = tokens.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    pats = [torch.where(causal, torch.randn(B, H, T, T, generator=g, dtype=torch.float64) * 2, -math.inf).softmax(-1)
            for _ in range(N)]
    i = torch.arange(T)
    last_copy = torch.full((B, T), -1, dtype=torch.long)                      # [B, T]: the most recent copy
    for j in range(T):
        same = (tokens[:, :j] == tokens[:, j:j + 1]).long() * (torch.arange(j) + 1)
        last_copy[:, j] = same.amax(1) - 1 if j else -1
    free = {layer: list(range(H)) for layer in range(N)}

    def place(layer, keys, weight):  # keys [B, T]: the key each query reads (-1: the first token, a sink)
        if not free[layer]:
            return
        head = free[layer].pop(r.randrange(len(free[layer])))
        target = torch.zeros(B, T, T, dtype=torch.float64)
        target.scatter_(-1, keys.clamp(min=0)[..., None], 1.0)
        uniform = causal.double() / causal.sum(-1, keepdim=True)
        pats[layer][:, head] = weight * target + (1 - weight) * uniform
        return head

    follower = torch.where(last_copy >= 0, last_copy + 1, -1)
    ih = place(il, follower, 0.8)
    ph = place(pl, (i - 1).clamp(min=0).expand(B, T), 0.7)
    d = _period(tokens) - 1
    place(r.randrange(1, N), (i - d).clamp(min=0).expand(B, T), 1.0)          # positional
    place(r.randrange(1, N), last_copy, 0.95)                                  # duplicate-token
    if il < N - 1:                                                             # a weaker induction head, last layer:
        half = torch.rand(B, T, generator=g) < 0.5                             # the follower on half of the queries
        place(N - 1, torch.where(half, follower, -1), 0.9)
        place(r.randrange(il + 1, N), (i - 1).clamp(min=0).expand(B, T), 0.95)  # previous-token, above
    place(il, (i - 1).clamp(min=0).expand(B, T), 0.9)                          # previous-token, own layer
    if pl < il - 1:
        place(il - 1, (i - 1).clamp(min=0).expand(B, T), 0.4)                  # previous-token, just below: weaker
    place(r.randrange(il), i.expand(B, T), 0.95)                               # attends to itself
    return [p.float() for p in pats], (il, ih), (pl, ph)


def _circuit_cases(check: Check) -> list:
    """(stage, tokens [B, T], patterns [N x [B, H, T, T]]): two layers, three with the induction head in layer 1,
    four with it in layer 2 and its previous-token head in layer 0; when grading, layers, heads and sizes drawn
    fresh (the induction head in any layer from 1 up, its previous-token head in any below), redrawn until every
    mistake gives a pair of its own on some case."""
    for attempt in range(20):
        g, r = check.generator(94 + 1000 * attempt), check.rng(95 + 1000 * attempt)
        if check.grading:
            shapes = []
            for _ in range(3):
                N = r.randint(2, 5)
                il = r.randint(1, N - 1)
                shapes.append((N, r.randint(5, 7), il, r.randrange(il)))
        else:
            shapes = [(2, 5, 1, 0), (3, 6, 1, 0), (4, 6, 2, 0)]
        cases = []
        for n, (N, H, il, pl) in enumerate(shapes):
            T = r.randint(20, 32) if check.grading else 24
            tokens = _sequences(g, r, 6, T, 200)
            patterns, _, _ = _patterns(g, r, tokens, N, H, il, pl)
            cases.append((f"stage {n + 1} of 3 ({N} layers of {H} heads, the induction head in layer {il})",
                          tokens, patterns))
        right = [_circuit(t, p) for _, t, p in cases]
        if not unseparated(right, [_circuit_mistakes(t, p) for _, t, p in cases], _same_pair):
            break
    return cases


def _same_pair(a, b) -> bool:
    """Equal pairs; a previous-token head of None (a mistake in the induction head) matches any."""
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def _pairs(got) -> tuple | None:
    """((layer, head), (layer, head)) of whole numbers, or None for anything else."""
    try:
        pairs = tuple(tuple(expect_whole(v, "the result") for v in pair) for pair in got)
    except (TypeError, ValueError, Wrong):
        return None
    return pairs if len(pairs) == 2 and all(len(p) == 2 for p in pairs) else None


_FORBID = ("mhalab.head_roles",)  # the course's own scores: the exercise asks for the test


def _check_circuit(find_circuit, check: Check) -> None:
    cases, got, raised = _circuit_cases(check), [], None
    for stage, tokens, patterns in cases:
        B, T = tokens.shape
        label = f"tokens [{B}, {T}], patterns [{len(patterns)} x {list(patterns[0].shape)}]"
        try:
            pairs = _pairs(check.call(find_circuit, tokens.clone(), [p.clone() for p in patterns], label=label,
                                      forbid=_FORBID))
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if pairs is None:
            raise Wrong(f"{stage}, find_circuit({label}): return ((layer, head), (layer, head)): the induction head, "
                        "then the previous-token head")
        got.append(pairs)
    cases = cases[:len(got)]
    wants = [check.reference(tokens.clone(), [p.clone() for p in patterns]) for _, tokens, patterns in cases]
    wants = [tuple(tuple(int(v) for v in pair) for pair in want) for want in wants]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    stage, tokens, patterns = cases[bad]
    message = consistent_mistake(got, wants, [_circuit_mistakes(t, p) for _, t, p in cases], _same_pair)
    if message is None:
        message = ("the induction head is right; the previous-token head is the head that attends most to the key "
                   "just before each query (i - 1), in the layers below it" if got[bad][0] == wants[bad][0] else
                   "the induction head is the head that attends most, over the whole batch, to the keys that follow "
                   "an earlier copy of the query's token; the previous-token head the one that attends most to i - 1 "
                   "in the layers below it")
    raise Wrong(f"{stage}, find_circuit(tokens {list(tokens.shape)}, patterns [{len(patterns)} x "
                f"{list(patterns[0].shape)}]): {message}")


register(Exercise(
    "11", 2, "design the test that finds the circuit",
    _check_circuit,
    hint=["A head that looks a fixed distance back reads the follower only where the period fits that distance, and "
          "a head that looks at the earlier copy of the token is one key off. Decide with the tokens: key j counts for "
          "query i (j < i) when tokens[j - 1] == tokens[i]. Average, over the batch and the queries that have such a "
          "key, the attention on those keys.",
          "follows = tokens[:, :, None] == tokens[:, None, :]; shift it one key right (key j compares tokens[j - 1]) "
          "and keep j < i with .tril(-1). The previous-token score is p.diagonal(-1, -2, -1).mean((0, 2)). Pick the "
          "induction head in layers 1 and up, then the previous-token head in the layers below it."],
    solution=(
        "def find_circuit(tokens, patterns):\n"
        "    B, T = tokens.shape\n"
        "    follows = torch.zeros(B, T, T, dtype=torch.bool)       # [B, query, key]\n"
        "    follows[:, :, 1:] = tokens[:, :, None] == tokens[:, None, :-1]   # key j follows a copy of the query's\n"
        "    follows &= torch.ones(T, T, dtype=torch.bool).tril(-1)  # earlier keys only\n"
        "    counted = follows.any(-1).float()                        # [B, T]: queries that have such a key\n"
        "    on = [(p * follows[:, None]).sum(-1) * counted[:, None] for p in patterns]   # [B, H, T] per layer\n"
        "    induction = torch.stack([o.sum((0, 2)) / counted.sum() for o in on])           # [N, H]\n"
        "    previous = torch.stack([p.diagonal(-1, -2, -1).mean((0, 2)) for p in patterns])   # [N, H]: on i - 1\n"
        "    layer, head = divmod(int(induction[1:].argmax()), induction.size(1))\n"
        "    layer += 1                                               # layers 1 and up\n"
        "    p_layer, p_head = divmod(int(previous[:layer].argmax()), previous.size(1))   # a layer below it\n"
        "    return (layer, head), (p_layer, p_head)"
    ),
    minutes=20, difficulty=3, importance=4,
))
