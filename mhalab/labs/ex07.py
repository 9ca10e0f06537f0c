"""Exercises of notebook 07 (what the heads do): switch one head off with a hook on its ``z``, predict from the
attention patterns alone which head each relation depends on (the notebook then switches the heads off), and predict
how many heads could go together if their costs simply added up.

Exercise 1 runs the learner's function on small hidden models (other sizes, a causal one, one with several targets
per position) and compares with :mod:`mhalab.head_interventions`; the answer may run a model and attach hooks
(``model.run_with_hooks``, ``model.hooks``, ``register_forward_hook``), but, as its prompt says, an answer that
calls the course's own ablation (``ablate_heads``, ``gate_heads``, ``mhalab.ablation``) scores 0. Exercise 2 runs
on caches of drawn attention patterns whose heads favour the relations' keys, their mirror images, keys one off and
the sequence's ends, so that every misreading names another head on some case; a tie is hard attention, exact in
any precision. Exercise 3 is a prediction from a table of single-head costs, checked on hidden tables whose costs
are multiples of 1/64.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .calls import Check
from .core import Exercise, register
from .judging import consistent_mistake, expect_whole, judge, pattern_cache, unseparated
from .verdicts import AnswerRaised, Wrong

#: What exercise 1's prompt forbids (the course's own ablation); everything else of mhalab may run.
_FORBID = ("mhalab.head_interventions.ablate_heads", "mhalab.head_interventions.gate_heads", "mhalab.ablation")

_MODELS = [  # (config, seed, batch, seq_len): a bidirectional model, a causal one with two targets per position
    (dict(d_vocab=13, d_model=24, n_heads=3, n_layers=2, n_ctx=16), 0, 3, 9),
    (dict(d_vocab=10, d_model=32, n_heads=4, n_layers=3, n_ctx=12, causal=True, n_targets=2), 1, 2, 7),
]


def _models(check: Check):
    """Small seeded models with their tokens and targets (some targets -100: no target there)."""
    out = []
    for config, seed, B, T in _MODELS:
        model = check.hidden_model(config, seed)  # larger weights than at initialisation, so every head matters
        g = check.generator(seed + 10)
        tokens = torch.randint(0, config["d_vocab"], (B, T), generator=g)
        shape = (B, T) + ((config["n_targets"],) if config.get("n_targets", 1) > 1 else ())
        targets = torch.randint(0, config["d_vocab"], shape, generator=g)
        targets[..., 0] = -100
        out.append((model, tokens, targets))
    return out


def _in_units(got, s: float):
    """An array-like answer divided by ``s``; anything else as it is (judged, and refused, as it is)."""
    return got / s if isinstance(got, (torch.Tensor, np.ndarray)) else got


def _with_hook(model, tokens, layer, edit):
    with torch.no_grad():
        return model.run_with_hooks(
            tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", lambda z, hook: edit(z.clone()))]
        )


def _zeroed(heads):
    def hook(z):  # z: [B, T, H, dk]
        z[:, :, heads] = 0.0
        return z
    return hook


# ------------------------------------------------------------------------------------ exercise 1
def _check_ablate(ablate_head, check: Check) -> None:
    for model, tokens, _ in _models(check):
        N, H = model.config.n_layers, model.config.n_heads
        with torch.no_grad():
            clean = model(tokens)
        for layer, head in [(0, 1), (N - 1, H - 1), (1, 0)]:
            label = f"a {N}-layer model with {H} heads, tokens {list(tokens.shape)}, layer={layer}, head={head}"
            got = check.call(ablate_head, model, tokens, layer, head, label=label, copy_args=False, forbid=_FORBID,
                             facts=("model_changed",))
            leaked = check.observe("model_changed")
            if leaked:
                raise Wrong(f"ablate_head({label}): after your function returned, the model still runs with a head "
                            "off. Remove the hook when you are done (model.run_with_hooks and model.hooks do it for "
                            "you)")
            others = [h for h in range(H) if h != head]
            want = check.reference(model, tokens, layer, head)
            # A float32 forward pass rounds in proportion to the size of its logits, not of each entry: compare in
            # units of the largest logit, so an entry near 0 is not held to a tolerance its rounding cannot meet.
            s = float(want.detach().abs().max()) or 1.0
            judge(_in_units(got, s), want / s, f"ablate_head({label})", lambda: {k: v / s for k, v in {
                "nothing changed: the result is the intact model's. Does your hook return the new z (or change it in "
                f"place), and is it on blocks.{layer}.attn.hook_z?": clean,
                "you zeroed a query position, not a head: z is [batch, query, head, d_head]":
                    _with_hook(model, tokens, layer, lambda z: (z.__setitem__((slice(None), head), 0.0), z)[1]),
                "that switches off every head of the layer, not one":
                    _with_hook(model, tokens, layer, _zeroed(list(range(H)))),
                "that switches off every head of the layer except the one asked":
                    _with_hook(model, tokens, layer, _zeroed(others)),
                **{f"that switches off head {head} of layer {other}, not of layer {layer}":
                   check.reference(model, tokens, other, head) for other in range(N) if other != layer},
            }.items()})


register(Exercise(
    "07", 1, "switch one head off",
    _check_ablate,
    hint=["Every attention layer has a hook point `blocks.{layer}.attn.hook_z` holding each head's output "
          "[batch, query, head, d_head], before W_O mixes the heads.",
          "Write a hook `fn(z, hook)` that returns a copy of z with that head's slice set to zero, and run the "
          "model with `model.run_with_hooks(tokens, fwd_hooks=[(point, fn)])`: the hook is gone afterwards."],
    solution=(
        "def ablate_head(model, tokens, layer, head):\n"
        "    def switch_off(z, hook):                # z: [batch, query, head, d_head]\n"
        "        z = z.clone()\n"
        "        z[:, :, head] = 0.0                 # this head now adds nothing through W_O\n"
        "        return z\n"
        "    with torch.no_grad():\n"
        "        return model.run_with_hooks(tokens, fwd_hooks=[(f'blocks.{layer}.attn.hook_z', switch_off)])"
    ),
    minutes=15, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
# Hidden cases are caches of attention patterns, not models: heads drawn to favour one offset each (a relation's, its
# mirror, one off, the edges, itself), so that every reading below names another head on some case.
def _reading(A: torch.Tensor, offset: int, *, mirror: bool = False, shift: int = 0, edge: str = "out",
             stat: str = "mean", first: bool = False, both: bool = False) -> torch.Tensor:
    """``[N, H]``: each head's score for a relation at ``offset``, as the right reading (defaults) or a mistaken one
    computes it. ``A``: ``[N, B, H, T, T]`` in float64."""
    A = A[:, :1] if first else A                                       # the first sequence only
    T = A.size(-1)
    q = torch.arange(T)
    if both:                                                           # keys at that distance, on both sides
        mask = ((q[None, :] - q[:, None]).abs() == abs(offset)).double()   # [T, T]
        return (A * mask).sum(-1).mean(dim=(1, 3))
    k = q - offset if mirror else q + offset + shift                   # [T]: each query's key
    valid = (k >= 0) & (k < T) if edge == "out" else torch.ones(T, dtype=torch.bool)
    k = k % T if edge == "wrap" else k.clamp(0, T - 1)
    on_key = (A.argmax(-1) == k).double() if stat == "top" else A[..., q, k]   # [N, B, H, T]
    on_key = on_key[..., valid]
    return on_key.amax(dim=(1, 3)) if stat == "max" else on_key.mean(dim=(1, 3))


def _pick(score: torch.Tensor, *, tie: str = "first", index: str = "heads", layers: str = "all") -> tuple[int, int]:
    """The (layer, head) of the largest score: the first of equal ones in (layer, head) order, or as a mistake
    would read it."""
    N, H = score.shape
    score = score.clone()
    if layers == "first":
        score[1:] = -math.inf
    elif layers == "last":
        score[:-1] = -math.inf
    flat = score.flatten()
    at = (flat == flat.max()).nonzero().flatten()
    return divmod(int(at[0] if tie == "first" else at[-1]), H if index == "heads" else N)


def _stack(cache) -> torch.Tensor:
    return torch.stack([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(len(cache))]).double()  # [N,B,H,T,T]


def _carrier(cache, offsets: dict[str, int], pick: dict | None = None, **reading) -> dict[str, tuple[int, int]]:
    """The checker's own reading (defaults), or a mistaken one: {relation: (layer, head)}."""
    A = _stack(cache)
    return {name: _pick(_reading(A, o, **reading), **(pick or {})) for name, o in offsets.items()}


#: {message: (how that reading scores, how it picks)}, in the order a message is looked for
_CARRIER_READINGS = {
    "pattern[b, h, q, k] is query q's weight on key k, and the relation's key is k = q + offset (left2's offset is "
    "-2): you read the key at q - offset, or took the query axis for the key axis":
        (dict(mirror=True), {}),
    "that reads the key one position to the right of the relation's: the key is exactly q + offset":
        (dict(shift=1), {}),
    "that reads the key one position to the left of the relation's: the key is exactly q + offset":
        (dict(shift=-1), {}),
    "a query whose key q + offset falls off the sequence has no key for the relation: leave it out (batch.sources "
    "marks it -1), do not read the first or last position instead": (dict(edge="clamp"), {}),
    "a key past one end of the sequence is not the one at the other end (torch.roll or % T wraps round): leave out "
    "the queries whose key q + offset falls off the sequence": (dict(edge="wrap"), {}),
    "a relation's key is on one side of the query, q + offset: not every key at that distance, on both sides":
        (dict(both=True), {}),
    "that counts how often the relation's key is a query's top key; the question is how much weight the head puts "
    "there, on average over the batch and the queries": (dict(stat="top"), {}),
    "that is the head's single largest weight on the key; the question is how much weight it puts there on "
    "average, over the batch and the queries": (dict(stat="max"), {}),
    "that averages the first sequence of the batch only: average over every sequence": (dict(first=True), {}),
    "search every layer's heads: that searched the first layer only": ({}, dict(layers="first")),
    "search every layer's heads: that searched the last layer only": ({}, dict(layers="last")),
    "a flat index over [n_layers, n_heads] is layer * n_heads + head: divmod it by n_heads, not n_layers":
        ({}, dict(index="layers")),
    "where heads tie, name the first in (layer, head) order, as argmax does": ({}, dict(tie="last")),
}


def _carrier_mistakes(cache, offsets: dict[str, int]) -> dict[str, dict]:
    """{message: what that reading names, {relation: (layer, head)}} for one case."""
    return {message: _carrier(cache, offsets, pick, **reading)
            for message, (reading, pick) in _CARRIER_READINGS.items()}


def _margin(cache, offsets: dict[str, int]) -> float:
    """The smallest gap, over relations and readings (the tie reading aside), between the best score and the next,
    exact ties (weights of exactly 0 in the future of a causal query, counts) aside: kept far above float32 rounding,
    so that an answer computed in another precision or order names the same head."""
    A, gaps = _stack(cache), []
    for reading, pick in [({}, {}), *_CARRIER_READINGS.values()]:
        if pick.get("tie"):
            continue
        for o in offsets.values():
            score = _reading(A, o, **reading)
            if pick.get("layers") == "first":
                score = score[:1]
            elif pick.get("layers") == "last":
                score = score[-1:]
            top = score.flatten().sort(descending=True).values
            gap = float(top[0] - top[1]) if len(top) > 1 else 0.0
            gaps.append(gap if gap > 0 else math.inf)
    return min(gaps)


def _patterns_favouring(g: torch.Generator, r, N: int, B: int, H: int, T: int, offsets: list[int],
                        causal: bool) -> torch.Tensor:
    """``[N, B, H, T, T]``: each head favours one offset (or the first or last position), by an amount that varies
    from sequence to sequence."""
    q = torch.arange(T)
    logits = torch.randn(N, B, H, T, T, generator=g) * 0.7
    menu = sorted({d for o in offsets for d in (o, -o, o + 1, o - 1)} | {0, "first", "last"}, key=str)
    for layer in range(N):
        for head in range(H):
            favourite = r.choice(menu)
            k = {"first": torch.zeros(T, dtype=torch.long), "last": torch.full((T,), T - 1)}.get(favourite)
            if k is None:
                k = q + favourite
            inside = (k >= 0) & (k < T)
            boost = (0.5 + 3.5 * r.random()) * (0.3 + 1.4 * torch.rand(B, 1, generator=g))   # [B, 1]
            view = logits[layer, :, head]                                                 # [B, T, T], a view
            view[:, q[inside], k[inside]] += boost
    if causal:
        logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    return logits.softmax(-1).float()


def _tie_case():
    """Hard attention (every weight 0 or 1, so every mean is exact): L0H0 and L1H1 both look one to the left."""
    T, q = 5, torch.arange(5)
    def one_hot(keys):
        return torch.nn.functional.one_hot(keys.clamp(0, T - 1), T).float()[None, None].expand(2, 1, T, T)  # [B,1,T,T]
    left, right, itself = one_hot(q - 1), one_hot(q + 1), one_hot(q)
    patterns = [torch.cat([left, right], 1), torch.cat([itself, left], 1)]    # [B=2, H=2, T, T] per layer
    return pattern_cache([p.contiguous() for p in patterns]), {"left1": -1, "right1": 1}, "two heads tie on left1"


#: (n_layers, batch, heads, seq_len, {relation: offset}, causal, what): the shapes of the drawn cases
_CARRIER_SHAPES = [
    (2, 4, 3, 6, {"left2": -2, "left1": -1, "right1": 1, "right2": 2}, False, "the notebook's four relations"),
    (3, 3, 2, 5, {"back3": -3, "next": 1}, False, "more layers than heads"),
    (2, 2, 4, 7, {"previous": -1, "back3": -3}, True, "causal"),
    (1, 2, 5, 5, {"right3": 3}, False, "one layer; two queries have the key"),
]


def _carrier_cases(check: Check) -> list:
    """Caches of patterns drawn for the shapes above (when grading, fresh ones and two of drawn shapes too), again
    until every reading names another head than the right one on some case and the best heads are clear, then the
    tie."""
    for attempt in range(200):
        g, r = check.generator(700 + attempt), check.rng(700 + attempt)
        shapes = list(_CARRIER_SHAPES)
        if check.grading:
            for i in range(2):
                T = r.randint(5, 9)
                offsets = r.sample([d for d in range(-3, 4) if d and abs(d) < T - 1], r.randint(1, 3))
                names = {d: ("left" if d < 0 else "right") + str(abs(d)) for d in offsets}
                shapes.append((r.randint(2, 3), r.randint(2, 4), r.randint(2, 5), T,
                               {names[d]: d for d in offsets}, False, f"drawn case {i}"))
        cases = [(pattern_cache(list(_patterns_favouring(g, r, N, B, H, T, list(offsets.values()), causal))),
                  offsets, what) for N, B, H, T, offsets, causal, what in shapes]
        if min(_margin(c, o) for c, o, _ in cases) < 1e-4:
            continue
        cases.append(_tie_case())
        if not unseparated([_carrier(c, o) for c, o, _ in cases], [_carrier_mistakes(c, o) for c, o, _ in cases],
                           _same_carriers):
            return cases
    raise RuntimeError("no draw of hidden caches separates every reading")  # the tests draw 21 sets


def _same_carriers(a: dict, b: dict) -> bool:
    return a == b


def _as_head(value) -> tuple[int, int] | None:
    """A (layer, head) pair of whole numbers (a tuple, list, array or tensor of two), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 1:
            return None
        value = value.tolist()
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return None
    out = []
    for x in value:
        if isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim == 0:
            x = x.item()
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or \
                not float(x).is_integer():
            return None
        out.append(int(x))
    return out[0], out[1]


#: What exercise 2's prompt forbids: the course's own head scores (the answer computes one).
_SCORES = ("mhalab.head_roles",)


def _check_carrier(predicted_carrier, check: Check) -> None:
    cases = _carrier_cases(check)

    def label(case):
        cache, offsets, what = case
        B, H, T, _ = cache["blocks.0.attn.hook_pattern"].shape
        return f"a cache of {len(cache)} layers, each [{B}, {H}, {T}, {T}], relation_offsets={offsets} ({what})"

    got, raised = [], None
    for case in cases:
        cache, offsets, _ = case
        try:
            value = check.call(predicted_carrier, cache, dict(offsets), label=label(case), forbid=_SCORES)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if not isinstance(value, dict) or sorted(value, key=str) != sorted(offsets):
            raise Wrong(f"for {label(case)}: return a dict with one entry per relation, keyed by its name as "
                        f"relation_offsets names it, got {check.last_call[1]}")
        heads = {name: _as_head(value[name]) for name in offsets}
        if any(h is None for h in heads.values()):
            flat = any(isinstance(value[n], (int, np.integer)) for n in offsets)
            raise Wrong(f"for {label(case)}: give each relation's head as a (layer, head) pair of whole numbers"
                        + (", not one number (a flat index, or the head alone)" if flat else ""))
        got.append(heads)
    cases = cases[:len(got)]
    wants = [{n: tuple(int(x) for x in h) for n, h in check.reference(c, dict(o)).items()} for c, o, _ in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    name = next(n for n in wants[bad] if got[bad][n] != wants[bad][n])
    missed = consistent_mistake(got, wants, [_carrier_mistakes(c, o) for c, o, _ in cases], _same_carriers)
    raise Wrong(f"for {label(cases[bad])}: " + (missed or f"the head you named for {name} is not the one whose weight "
                                                 "on the relation's key, averaged over the batch and over the queries "
                                                 "that have that key, is the largest"))


register(Exercise(
    "07", 2, "which head does a relation depend on, by its pattern",
    _check_carrier,
    hint=["pattern[b, h, q, k] is query q's weight on key k, and the relation's key for query q is k = q + offset. "
          "torch.diagonal(pattern, offset, dim1=-2, dim2=-1) holds exactly those weights, [batch, head, T - |offset|], "
          "for the queries whose key lies inside the sequence.",
          "Average those weights over the batch and the queries: one score per head. Stack the layers into "
          "[n_layers, n_heads]; argmax of the flattened scores is layer * n_heads + head (divmod gives the pair)."],
    solution=(
        "def predicted_carrier(patterns, relation_offsets):\n"
        "    N = len(patterns)\n"
        "    A = torch.stack([patterns[f'blocks.{i}.attn.hook_pattern'] for i in range(N)])   # [N, B, H, T, T]\n"
        "    H = A.size(2)\n"
        "    carrier = {}\n"
        "    for name, offset in relation_offsets.items():\n"
        "        on_key = A.diagonal(offset, dim1=-2, dim2=-1)   # [N, B, H, T - |offset|]: q's weight on q + offset\n"
        "        score = on_key.mean(dim=(1, 3))                 # [N, H]: over the batch and those queries\n"
        "        carrier[name] = divmod(int(score.argmax()), H)  # (layer, head); a tie goes to the first\n"
        "    return carrier"
    ),
    minutes=15, difficulty=3, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 3
# Costs are multiples of 1/64 (exact in float32 and float64, and in any order of summing), so a threshold can be
# hit exactly: a strict comparison then differs from the right one.
def _independent(costs: torch.Tensor, threshold: float) -> int:
    """The checker's own reading: the k cheapest heads' summed cost is the least any k heads cost."""
    return int((costs.flatten().double().sort().values.cumsum(0) <= threshold).sum())


def _budget_mistakes(costs: torch.Tensor, threshold: float) -> dict[str, int]:
    """{what a plausible mistake misses: the count it returns} for one case."""
    flat = costs.flatten().double()
    n = flat.numel()

    def within(order: torch.Tensor, summed=None) -> int:  # heads counted while the summed cost stays within
        summed = order.cumsum(0) if summed is None else summed
        over = (summed > threshold).nonzero()
        return int(over[0]) if len(over) else n

    ascending = flat.sort().values
    return {
        "that counts the heads that each cost at most the threshold on their own; switched off together, "
        "independent heads' costs add up: sum the costs of the heads you remove": int((flat <= threshold).sum()),
        "a loss exactly at the threshold is still within it: count while the summed cost is at most the threshold "
        "(<=, not <)": int((ascending.cumsum(0) < threshold).sum()),
        "the head whose cost takes the sum past the threshold cannot go too: count only the heads before it":
            min(_independent(costs, threshold) + 1, n),
        "remove the cheapest heads first: the k cheapest are the k heads whose costs sum to the least, so they let "
        "the most heads go": within(flat.sort(descending=True).values),
        "sort the heads by their cost first: in the order given, a costly head early uses up the budget that "
        "several cheap ones would have fitted in": within(flat),
        "a head whose removal raised the accuracy has a negative cost: under independence it pays for part of the "
        "others' costs, so add the costs as they are (no clipping at 0)": within(flat.clamp(min=0).sort().values),
        "cheapest means the smallest cost, and a negative cost (the accuracy rose) is the cheapest of all: sort by "
        "the cost itself, not by its size": within(flat[flat.abs().argsort(stable=True)]),
        "the threshold is for the whole model: sort and sum the costs of all the heads together, not layer by "
        "layer": sum(_independent(row, threshold) for row in costs.double().reshape(costs.shape[0], -1)),
        "independent costs add up: compare their sum with the threshold, not their mean":
            within(ascending, ascending.cumsum(0) / torch.arange(1, n + 1)),
    }


_BUDGET_CASES = [  # (costs [layers, heads] in 64ths, threshold in 64ths)
    ([[0, 16, 8, 32], [64, 4, 48, 24]], 28),        # the threshold hit exactly by the four cheapest
    ([[-64, 16, 32, 48]], 32),                      # a head that helps: it pays for the others
    ([[32, 48], [40, 64]], 16),                     # no head fits
    ([[8, 8, 8, 8], [8, 8, 32, 32]], 16),           # every head cheap alone, not together
    ([[0, 0, 16], [0, 32, 8]], 0),                  # a threshold of zero: the free heads go
    ([[40, 1, 2], [3, 0, 5], [4, 6, 7]], 20),       # the costly head first in the order given
    ([[0]], 1),                                     # one head
    ([[-8, 4, 2, 6, 1], [3, -2, 5, 12, 7], [9, 1, 0, 2, 3]], 1000),   # every head fits
]


def _budget_cases(check: Check) -> list[tuple[torch.Tensor, float]]:
    """The fixed cases (every mistake named gives a count of its own on one of them) and, when grading, three drawn
    fresh: shapes from [1, 1] to [4, 12], a few negative costs, thresholds hit exactly or not."""
    cases = [(torch.tensor(c, dtype=torch.float32) / 64, t / 64) for c, t in _BUDGET_CASES]
    if check.grading:
        r = check.rng(53)
        for _ in range(3):
            L, H = r.randint(1, 4), r.randint(1, 12)
            costs = torch.tensor([[r.choice([r.randint(-16, -1)] + [r.randint(0, 40)] * 5) for _ in range(H)]
                                  for _ in range(L)], dtype=torch.float32)
            summed = costs.flatten().sort().values.cumsum(0)
            threshold = int(r.choice(summed.tolist())) if r.random() < 0.5 else r.randint(0, int(summed[-1]) + 8)
            cases.append((costs / 64, max(threshold, 0) / 64))
    return cases


def _check_budget(removable_if_independent, check: Check) -> None:
    cases, got, raised = _budget_cases(check), [], None
    for costs, threshold in cases:
        label = f"costs of shape {list(costs.shape)}, threshold={threshold:g}"
        try:
            value = check.call(removable_if_independent, costs, threshold, label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        got.append(expect_whole(value, f"what removable_if_independent({label}) returned (a number of heads)"))
    cases = cases[:len(got)]
    wants = [int(check.reference(costs.clone(), threshold)) for costs, threshold in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    costs, threshold = cases[bad]
    label = f"costs of shape {list(costs.shape)}, threshold={threshold:g}"
    missed = consistent_mistake(got, wants, [_budget_mistakes(*c) for c in cases], lambda a, b: a == b)
    if missed:
        raise Wrong(f"for {label}: {missed}")
    raise Wrong(f"for {label} you said {got[bad]} heads, which is too {'many' if got[bad] > wants[bad] else 'few'}: "
                "with independent heads, a set of heads costs the sum of their costs; how many heads can a sum "
                "within the threshold hold at most?")


register(Exercise(
    "07", 3, "how many heads could go if they were independent",
    _check_budget,
    hint=["If the heads were independent, switching off a set of them would cost the sum of their single costs. "
          "Which k heads have the smallest sum?",
          "Sort all the costs (every layer together) from the smallest up, a negative one first; the running sum "
          "after k of them is the least k heads can cost. Count the k whose running sum is at most the threshold."],
    solution=(
        "def removable_if_independent(drops, threshold):\n"
        "    costs = torch.as_tensor(drops).flatten().sort().values  # cheapest first; negative (helpful) "
        "ones first of all\n"
        "    summed = costs.cumsum(0)                # [n]: the least that k heads cost together, if costs add up\n"
        "    return int((summed <= threshold).sum())   # (past the negative costs, the sum only grows)"
    ),
    minutes=10, difficulty=2, importance=3,
))
