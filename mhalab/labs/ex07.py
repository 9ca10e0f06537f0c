"""Exercises of notebook 07 (what the heads do): switch one head off with a hook on its ``z``, measure what
switching off each head costs, and compute a previous-token score yourself.

Exercises 1 and 2 run the learner's function on small hidden models (other sizes, a causal one, one with
several targets per position) and compare with :mod:`mhalab.head_interventions`/:mod:`mhalab.ablation`. The answer may
run a model and attach hooks (``model.run_with_hooks``, ``model.hooks``, ``register_forward_hook``); in exercise 1,
as its prompt says, an answer that calls the course's own ablation (``ablate_heads``, ``gate_heads``,
``mhalab.ablation``) scores 0. Exercise 2 may use anything, ``ablate`` included.
Heads' roles are named as everywhere in the course (:func:`mhalab.head_roles.role_of`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .calls import Check
from .core import Exercise, register
from .judging import as_float64, expect_shape, judge, previous_token_mistakes
from .verdicts import Wrong

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
            judge(got, check.reference(model, tokens, layer, head), f"ablate_head({label})", lambda: {
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
            })


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
def _pattern_cases(check: Check) -> list:
    g = check.generator(5)
    cases = []
    for B, H, T, causal in [(2, 3, 5, False), (1, 4, 9, True), (3, 1, 2, False), (2, 2, 7, True)]:
        scores = torch.randn(B, H, T, T, generator=g) * 3
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        cases.append((scores.softmax(-1),))
    return cases


def _check_prev_score(previous_token_score, check: Check) -> None:
    for (attention,) in _pattern_cases(check):
        label = f"attention {list(attention.shape)}"
        got = check.call(previous_token_score, attention, label=label)
        judge(got, check.reference(attention), f"previous_token_score({label})",
              lambda: {why: scores[0] for why, scores in previous_token_mistakes([attention]).items()})


register(Exercise(
    "07", 3, "a previous-token score of your own",
    _check_prev_score,
    hint=["attention[b, h, q, k] is how much query q attends to key k. The previous token of query q is key q - 1, "
          "which exists for q = 1 .. T-1 only.",
          "torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1) gives attention[..., q, q - 1] for every q >= 1; "
          "average it over the batch and those queries."],
    solution=(
        "def previous_token_score(attention):\n"
        "    # attention: [B, H, T, T] -> [H]\n"
        "    below = torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1)   # [B, H, T-1]: attention[q, q-1]\n"
        "    return below.mean(dim=(0, 2))"
    ),
    minutes=5, difficulty=1, importance=2,
))
