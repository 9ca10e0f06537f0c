"""Exercises of notebook 07 (what the heads do): switch one head off with a hook on its ``z``, measure what
switching off each head costs, and predict how many heads could go together if their costs simply added up.

Exercises 1 and 2 run the learner's function on small hidden models (other sizes, a causal one, one with
several targets per position) and compare with :mod:`mhalab.head_interventions`/:mod:`mhalab.ablation`. The answer may
run a model and attach hooks (``model.run_with_hooks``, ``model.hooks``, ``register_forward_hook``); in exercise 1,
as its prompt says, an answer that calls the course's own ablation (``ablate_heads``, ``gate_heads``,
``mhalab.ablation``) scores 0. Exercise 2 may use anything, ``ablate`` included.
Heads' roles are named as everywhere in the course (:func:`mhalab.head_roles.role_of`). Exercise 3 is a prediction
from a table of single-head costs, checked on hidden tables whose costs are multiples of 1/64.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, consistent_mistake, expect_shape, expect_whole, judge
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
def _loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def _check_effects(ablation_effects, check: Check) -> None:
    for model, tokens, targets in _models(check):
        N, H = model.config.n_layers, model.config.n_heads
        label = f"a {N}-layer model with {H} heads, tokens {list(tokens.shape)}, targets {list(targets.shape)}"
        got = check.call(ablation_effects, model, tokens, targets, label=label, copy_args=False)
        want = check.reference(model, tokens, targets)
        try:
            got = as_float64(got, "the result")  # a tensor, an array or nested lists, as everywhere
            expect_shape(got, (N, H), "the result")
        except Wrong as wrong:
            raise Wrong(f"ablation_effects({label}): {wrong} ([n_layers, n_heads])") from None
        judge(got, want, f"ablation_effects({label})", lambda: _effects_mistakes(model, tokens, targets, want))


def _effects_mistakes(model, tokens, targets, want) -> dict:
    N, H = model.config.n_layers, model.config.n_heads
    with torch.no_grad():
        base = float(_loss(model(tokens), targets))
    return {
        "the signs are flipped: a head that matters makes the loss *grow* when switched off (ablated - intact)": -want,
        "that is the loss with each head off; the question is how much it grows over the intact model's": want + base,
        "that is the loss summed over positions; take the mean, as the training loss does":
            want * int((targets != -100).sum()),
        "the loss counts the positions with no target (-100): cross_entropy leaves them out by default":
            torch.stack([torch.stack([_loss_all(model, tokens, targets, l, h) for h in range(H)]) for l in range(N)]),
    }


def _loss_all(model, tokens, targets, layer, head):
    """The mistake of counting positions without a target as class 0."""
    t = targets.clamp(min=0)
    with torch.no_grad():
        return _loss(_with_hook(model, tokens, layer, _zeroed([head])), t) - _loss(model(tokens), t)


register(Exercise(
    "07", 2, "what each head is worth",
    _check_effects,
    hint=["Loop over every (layer, head), switch that head off (your ablate_head does it) and compare the loss "
          "with the intact model's loss on the same tokens.",
          "The loss: F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)), V = logits.size(-1); positions "
          "whose target is -100 are left out by default. Return a [n_layers, n_heads] tensor."],
    solution=(
        "def ablation_effects(model, tokens, targets):\n"
        "    def loss(logits):                              # mean over the positions that have a target\n"
        "        V = logits.size(-1)\n"
        "        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()\n"
        "    def switch_off(head):                          # (your ablate_head from exercise 1 does the same)\n"
        "        def off(z, hook):                          # z: [batch, query, head, d_head]\n"
        "            z = z.clone()\n"
        "            z[:, :, head] = 0.0\n"
        "            return z\n"
        "        return off\n"
        "    N, H = model.config.n_layers, model.config.n_heads\n"
        "    with torch.no_grad():\n"
        "        intact = loss(model(tokens))\n"
        "        return torch.tensor([[loss(model.run_with_hooks(tokens, fwd_hooks=[(f'blocks.{l}.attn.hook_z', "
        "switch_off(h))]))\n"
        "                              - intact for h in range(H)] for l in range(N)])   # [N, H]"
    ),
    minutes=15, difficulty=2, importance=3,
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
