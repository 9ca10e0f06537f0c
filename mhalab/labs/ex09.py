"""Exercises of notebook 09 (heads form): the in-context-learning score from per-target losses, the step at
which a recorded curve has come a given fraction of the way (its onset or its halfway step), and which heads of
a recording are the induction head and the previous-token head below it.

All three run on hidden recordings made up here (random losses, curves with a blip or a fall, score tensors
with a head that peaks early and fades), staged where a stage catches a mistake the first cannot. When
grading, the values are drawn fresh. The answers may use anything (``FormationRecorder.first_step`` included).
"""

from __future__ import annotations

import torch

from .calls import Check
from .checks import expect_whole, judge, name_miss
from .core import Exercise, register
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _icl_cases(check: Check) -> list:
    """(stage, nll [B, T], window): one sequence, then a batch whose later targets are easier."""
    g, r = check.generator(90), check.rng(91)
    sizes = [("stage 1 of 2 (one sequence)", 1, 12, 3), ("stage 2 of 2 (a batch)", 4, 23, 5)]
    if check.grading:
        sizes.append(("stage 2 of 2 (a batch)", r.randint(2, 6), r.randint(14, 40), r.randint(2, 6)))
    cases = []
    for stage, B, T, w in sizes:
        easier = torch.linspace(1.0, 0.3, T, dtype=torch.float64)  # the context helps, as it does here
        cases.append((stage, torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * easier, w))
    return cases


def _check_icl(icl_score, check: Check) -> None:
    for stage, nll, w in _icl_cases(check):
        B, T = nll.shape
        label = f"{stage}, icl_score(nll [{B}, {T}], window={w})"
        got = check.call(icl_score, nll, w, label=f"nll [{B}, {T}], window={w}")
        judge(got, check.reference(nll, w), label, lambda: {
            "the sign is flipped: the score is late minus early (negative when the context helps)":
                -check.reference(nll, w),
            "that is a difference of sums; take the mean loss of each window":
                float(nll[:, -w:].sum() - nll[:, :w].sum()),
            "the windows hold one target too many: each is the first or last `window` targets":
                check.reference(nll, w + 1),
            "the windows hold one target too few: each is the first or last `window` targets":
                check.reference(nll, w - 1) if w > 1 else float("nan"),
            "that compares the two halves of the context; compare only the first and the last `window` targets":
                float(nll[:, T - T // 2:].mean() - nll[:, :T // 2].mean()),
            "that is the loss late in the context alone; subtract the loss early in it": float(nll[:, -w:].mean()),
        })


register(Exercise(
    "09", 1, "the in-context-learning score",
    _check_icl,
    hint=["Olsson et al.'s score is the loss late in the context minus the loss early in it: negative when the "
          "context helps.",
          "Take the mean of nll[:, -window:] (every sequence's last `window` targets) minus the mean of "
          "nll[:, :window], and return it as one number."],
    solution=(
        "def icl_score(nll, window):\n"
        "    late = nll[:, -window:].mean()                 # the last `window` targets of every sequence\n"
        "    early = nll[:, :window].mean()                 # the first `window`\n"
        "    return float(late - early)                     # negative: the context helps"
    ),
    minutes=5, difficulty=1, importance=2,
))


# ------------------------------------------------------------------------------------ exercise 2
def _stays_past(steps, curve, threshold: float, falling: bool, *, stay: bool = True):
    """The first step from which ``curve`` stays past ``threshold`` (at or below it when ``falling``); with
    ``stay=False`` the first step past it at all (the mistake)."""
    reached = curve <= threshold if falling else curve >= threshold  # [K]
    for k in range(len(steps)):
        if bool(reached[k:].all() if stay else reached[k]):
            return int(steps[k])
    return None


def _onset_cases(check: Check) -> list:
    """(stage, steps, curve [K], fraction): a smooth rise, a rise with an early blip, a falling loss."""
    g, r = check.generator(92), check.rng(93)
    every = r.choice([10, 20, 25]) if check.grading else 10
    K = 41
    steps = [every * k for k in range(K)]
    x = torch.linspace(-6, 6, K, dtype=torch.float64)
    middle = r.uniform(-2, 2) if check.grading else 0.8
    rise = 0.05 + 0.7 * torch.sigmoid(2 * (x - middle))                           # a score that forms
    noise = 0.01 * torch.randn(K, generator=g, dtype=torch.float64)
    blip = rise + noise
    blip[5] = 0.5                                                                 # passes the threshold, falls back
    blip[-8:] = blip[-8:] + 0.08                                                  # peaks before the end...
    blip[-1] = blip[-1] - 0.1                                                     # ...and the last value is lower
    fall = 3.6 - 2.8 * torch.sigmoid(1.5 * (x - middle)) + noise                  # a loss that drops
    return [("stage 1 of 3 (a smooth rise)", steps, rise + noise, 0.5),
            ("stage 2 of 3 (a rise with an early blip)", steps, blip, 0.1),
            ("stage 3 of 3 (a falling loss)", steps, fall, 0.1)]


def _check_onset(onset_step, check: Check) -> None:
    for stage, steps, curve, fraction in _onset_cases(check):
        label = f"steps (every {steps[1]}, {len(steps)} of them), curve [{len(steps)}], fraction={fraction}"
        got = check.call(onset_step, list(steps), curve.clone(), fraction, label=label)
        want = check.reference(list(steps), curve.clone(), fraction)
        if got is None:
            falls = float(curve[-1]) < float(curve[0])
            raise Wrong(f"{stage}, onset_step({label}): got None, but the curve does come {fraction:g} of the way "
                        "(its last value is all of the way)" + ("; this curve falls (a loss): it has come the fraction "
                                                                 "of the way once it is at or below the threshold"
                                                                 if falls else ""))
        got = expect_whole(got, "the result")
        if got == want:
            continue
        start, end, top = float(curve[0]), float(curve[-1]), float(curve.max())
        falling = end < start
        threshold = start + fraction * (end - start)
        raise Wrong(f"{stage}, onset_step({label}): got {got}; " + (name_miss(got, [
            (_stays_past(steps, curve, threshold, falling, stay=False), "that is the first step past the threshold, "
             "but the curve falls back below it later: return the first step from which it stays past the threshold "
             "to the end"),
            (_stays_past(steps, curve, start + fraction * (top - start), falling)
             if not falling and top > end else None,
             "the way goes from the first value to the *last* one, not to the highest"),
            (_stays_past(steps, curve, fraction * end, falling),
             "measure the way from the first value, not from zero: threshold = first + fraction * (last - first)"),
            (steps.index(want) if want in steps else None, "that is an index into steps; return the step itself"),
            (_stays_past(steps, curve, threshold, False) if falling else None, "this curve falls (a loss): it has come "
             "the fraction of the way once it is at or below the threshold"),
        ]) or "the first step at which the curve has come `fraction` of the way from its first value to its last, "
              "and stays there to the end"))


register(Exercise(
    "09", 2, "the onset step of a recorded curve",
    _check_onset,
    hint=["The threshold is first + fraction * (last - first): a tenth of the way for the onset, half for the "
          "halfway step. A loss falls, so for it 'past the threshold' means at or below it.",
          "A curve can pass the threshold and fall back: return steps[k] for the first k from which every later "
          "value is past the threshold."],
    solution=(
        "def onset_step(steps, curve, fraction):\n"
        "    curve = torch.as_tensor(curve, dtype=torch.float64)\n"
        "    first, last = float(curve[0]), float(curve[-1])\n"
        "    threshold = first + fraction * (last - first)\n"
        "    past = curve <= threshold if last < first else curve >= threshold   # a loss falls\n"
        "    for k in range(len(steps)):\n"
        "        if bool(past[k:].all()):                  # past it from here to the end\n"
        "            return int(steps[k])\n"
        "    return None"
    ),
    minutes=10, difficulty=2, importance=2,
))


# ------------------------------------------------------------------------------------ exercise 3
def _circuit_cases(check: Check) -> list:
    """(stage, induction [K, N, H], previous [K, N, H]): two layers, then three with distractors."""
    g, r = check.generator(94), check.rng(95)
    out = []
    for stage, N, H in (("stage 1 of 3 (two layers)", 2, 4), ("stage 2 of 3 (a head that peaks early)", 2, 5),
                        ("stage 3 of 3 (three layers)", 3, 4)):
        K = 21
        ramp = torch.linspace(0, 1, K)[:, None, None]
        induction = 0.05 + 0.1 * torch.rand(K, N, H, generator=g)
        previous = 0.05 + 0.1 * torch.rand(K, N, H, generator=g)
        top = N - 1
        i_head, p_head = r.randrange(H), r.randrange(H)
        p_layer = r.randrange(top)
        induction[:, top, i_head] += 0.6 * ramp[:, 0, 0]
        previous[:, p_layer, p_head] += 0.5 * ramp[:, 0, 0]
        if stage.startswith("stage 2") or stage.startswith("stage 3"):  # peaks mid-way above the final best, then fades
            other = (i_head + 1) % H
            induction[K // 2, top, other] = 0.95
        if stage.startswith("stage 3"):
            previous[:, top, (p_head + 2) % H] += 0.8 * ramp[:, 0, 0]  # a previous-token head in the top layer
            induction[:, 0, r.randrange(H)] += 0.9 * ramp[:, 0, 0]     # layer 0 scores high, but has nothing below
        out.append((stage, induction, previous))
    return out


def _check_circuit(circuit_heads, check: Check) -> None:
    for stage, induction, previous in _circuit_cases(check):
        K, N, H = induction.shape
        label = f"induction [{K}, {N}, {H}], previous [{K}, {N}, {H}]"
        got = check.call(circuit_heads, induction.clone(), previous.clone(), label=label)
        want = check.reference(induction.clone(), previous.clone())
        try:
            pairs = tuple(tuple(expect_whole(v, "the result") for v in pair) for pair in got)
            if len(pairs) != 2 or any(len(p) != 2 for p in pairs):
                raise ValueError
        except (TypeError, ValueError):
            raise Wrong(f"{stage}, circuit_heads({label}): return ((layer, head), (layer, head)): the induction head, "
                        "then the previous-token head") from None
        if pairs == want:
            continue
        (il, ih), (pl, ph) = want

        def best(scores, layers, *, ever=False):  # (layer, head) of the highest final (or ever) score in `layers`
            block = (scores.amax(0) if ever else scores[-1])[list(layers)]  # [len(layers), H]
            layer, head = divmod(int(block.argmax()), H)
            return (list(layers)[layer], head)

        anywhere = best(previous, range(N))
        mistakes = [
            (((ih, il), (ph, pl)), "the pairs are (layer, head), in that order"),
            ((want[1], want[0]), "the induction head comes first, then the previous-token head"),
            ((best(induction, range(1, N), ever=True), (pl, ph)), "that head's induction score peaked mid-way and "
             "faded; name the head with the highest score at the *last* recorded step"),
            (((il, ih), anywhere), "the previous-token head must sit in a layer *below* the induction head (its keys "
             "read what the layer below wrote)"),
            ((best(induction, range(N)), (pl, ph)), "a layer-0 head has no layer below it to compose with: look for "
             "the induction head in layers 1 and up"),
        ]
        message = name_miss(pairs, mistakes)
        if message is None and pairs[0] == want[0]:
            message = "the induction head is right; the previous-token head is the best one in the layers below it"
        raise Wrong(f"{stage}, circuit_heads({label}): " + (message or "the induction head is the layer-1-and-up head "
                    "with the highest final induction score; the previous-token head the best one in the layers below"))


register(Exercise(
    "09", 3, "which heads are the induction head and its previous-token head",
    _check_circuit,
    hint=["Read the last recorded step, induction[-1] ([N, H]): the induction head is the one with the highest score "
          "in layers 1 and up. Then, in the layers below it, the head with the highest final previous-token score.",
          "divmod(int(t.argmax()), t.size(1)) turns the argmax of an [L, H] tensor into (row, head); add back the "
          "layers you skipped."],
    solution=(
        "def circuit_heads(induction, previous):\n"
        "    final = induction[-1, 1:]                          # [N - 1, H]: the last step, layers 1 and up\n"
        "    layer, head = divmod(int(final.argmax()), final.size(1))\n"
        "    layer += 1                                         # back to the model's layer numbers\n"
        "    below = previous[-1, :layer]                       # [layer, H]: only the layers below it\n"
        "    p_layer, p_head = divmod(int(below.argmax()), below.size(1))\n"
        "    return (layer, head), (p_layer, p_head)"
    ),
    minutes=10, difficulty=2, importance=3,
))
