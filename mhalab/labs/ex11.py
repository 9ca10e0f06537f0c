"""Exercises of notebook 11 (heads form): the in-context-learning score from per-target losses, the step at
which a recorded curve has come a given fraction of the way (its onset or its halfway step), and which heads of
a recording are the induction head and the previous-token head below it.

All three run on hidden recordings made up here (random losses, curves with a blip or a fall, score tensors
with a head that peaks early and fades), staged where a stage catches a mistake the first cannot. When
grading, the values are drawn fresh. The answers may use anything (``FormationRecorder.first_step`` included).
"""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import consistent_mistake, expect_whole, judge, unseparated
from .verdicts import AnswerRaised, Wrong


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
    "11", 1, "the in-context-learning score",
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
def _first_from(steps, past, *, run: int | None = None):
    """steps[k] for the first k from which ``past`` holds to the end (or, with ``run``, for ``run`` records in a
    row: the mistake), else None."""
    past = [bool(p) for p in past]
    for k in range(len(steps)):
        if all(past[k:]) if run is None else all(past[k:k + run]) and k + run <= len(past):
            return int(steps[k])
    return None


def _past(curve: torch.Tensor, threshold: float, falling: bool, *, strict: bool = False) -> torch.Tensor:
    if falling:
        return curve < threshold if strict else curve <= threshold
    return curve > threshold if strict else curve >= threshold


def _smoothed(curve: torch.Tensor, window: int, *, centred: bool = False) -> torch.Tensor:
    """A moving average over ``window`` records (trailing, shorter at the start; or centred, shorter at the ends)."""
    values = curve.tolist()
    half = window // 2
    spans = [(max(0, k - half), k + half + 1) if centred else (max(0, k - window + 1), k + 1)
             for k in range(len(values))]
    return torch.tensor([sum(values[a:b]) / len(values[a:b]) for a, b in spans], dtype=torch.float64)


def _onset_mistakes(steps, curve: torch.Tensor, fraction: float, *, smoothing: bool = True) -> dict:
    """{message: the step (or None) that mistake gives} for one case; a mistake that does not apply is absent.
    ``smoothing``: with the readings of a smoothed curve (named when they explain every case, but not drawn apart:
    there are many ways to smooth)."""
    first, last = float(curve[0]), float(curve[-1])
    falling = last < first
    threshold = first + fraction * (last - first)

    def stays(values, t, **kw):
        return _first_from(steps, _past(values, t, falling, **kw))

    low, high = float(curve.min()), float(curve.max())
    start, end = (high, low) if falling else (low, high)  # the extremes, in the curve's direction
    right = stays(curve, threshold)
    out = {
        "that is the first step past the threshold, but the curve falls back later: return the first step from which "
        "it stays past the threshold to the end": _first_from(steps, _past(curve, threshold, falling), run=1),
        "that is the first step past the threshold for two records in a row, but the curve falls back later: return "
        "the first step from which it stays past the threshold to the end":
            _first_from(steps, _past(curve, threshold, falling), run=2),
        "that is the first step past the threshold for three records in a row, but the curve falls back later: "
        "return the first step from which it stays past the threshold to the end":
            _first_from(steps, _past(curve, threshold, falling), run=3),
        "a value exactly at the threshold has come the fraction of the way: compare with >= (<= for a falling "
        "curve), not > (<)": stays(curve, threshold, strict=True),
        "the way goes from the first recorded value to the last, not from the lowest value to the highest (the curve "
        "may dip below its first value and overshoot its last)": stays(curve, start + fraction * (end - start)),
        "the way goes from the first value to the *last* one, not to the highest (or, falling, the lowest)":
            stays(curve, first + fraction * (end - first)),
        "measure the way from the first value, not from zero: threshold = first + fraction * (last - first)":
            stays(curve, fraction * last),
        "measure the way from the first value toward the last: threshold = first + fraction * (last - first), not "
        "last + fraction * (first - last)": stays(curve, last + fraction * (first - last)),
    }
    if right is not None and right in steps:
        out["that is an index into steps; return the step itself"] = steps.index(right)
    if falling:
        out["this curve falls (a loss): it has come the fraction of the way once it is at or below the threshold"] = \
            _first_from(steps, curve >= threshold)
    for window, centred in ((2, False), (3, False), (5, False), (3, True), (5, True)) if smoothing else ():
        smooth = _smoothed(curve, window, centred=centred)
        kind = f"a {'centred' if centred else 'trailing'} moving average over {window} records"
        out[f"the curve is judged as recorded: smoothed ({kind}) it crosses the threshold elsewhere; find the first "
            "step from which the recorded values stay past first + fraction * (last - first)"] = \
            stays(smooth, float(smooth[0]) + fraction * (float(smooth[-1]) - float(smooth[0])))
    return out


_UNIT = 1 / 64  # the made-up curves' values are multiples of it: the threshold is exact in any float format


def _blips(r, *, falling: bool) -> tuple[torch.Tensor, float]:
    """(curve, fraction): a curve that crosses the threshold for one, two and three records and falls back each
    time, then touches it exactly (already past it: "at least") and stays past it to its last value. Values on a grid
    of 1/64 and fraction 1/4, so that every way of writing first + fraction * (last - first) gives the threshold
    exactly; a falling curve is a rising one mirrored."""
    a, d = r.randint(8, 24), r.randint(8, 16)
    b, t = a + 4 * d, a + d                               # the last value, the threshold (fraction 1/4)
    seq = [a] + [r.randint(a, t - 2) for _ in range(r.randint(1, 3))]
    for run in (1, 2, 3):                                 # past the threshold for `run` records, then back below
        seq += [t + r.randint(1, 4) for _ in range(run)] + [r.randint(a, t - 2) for _ in range(r.randint(1, 3))]
    seq += [t, t + 1] + sorted(r.randint(t + 2, b) for _ in range(r.randint(3, 6))) + [b]  # at it, then past it
    units = torch.tensor(seq, dtype=torch.float64)
    return (4 * b - units if falling else units) * _UNIT, 0.25


def _ramp(r, *, falling: bool) -> tuple[torch.Tensor, float]:
    """(curve, fraction): a curve that dips well below its first value, climbs one grid step per record through every
    threshold a reading could take, overshoots its last value and comes back down to it, staying above the threshold
    (mirrored: a falling loss). Each reading's threshold is then passed at its own record."""
    a, d, dip = r.randint(16, 32), r.randint(8, 16), r.randint(8, 16)
    b = a + 4 * d                                         # fraction 1/4: the threshold is a + d
    top = b + r.randint(2 * d, 4 * d)
    seq = [a, a - dip // 2] + list(range(a - dip, top + 1)) + list(range(top - 3, b, -r.randint(3, 5))) + [b]
    units = torch.tensor(seq, dtype=torch.float64)
    return (2 * top - units if falling else units) * _UNIT, 0.25


def _onset_cases(check: Check) -> list:
    """(stage, steps, curve [K], fraction): curves that cross and fall back, curves that dip and overshoot (one
    rising, one falling, at random when grading), and a smooth rise as a recorder gives it; drawn fresh when grading,
    and redrawn (a few times at most) until every mistake gives a step of its own on some case."""
    for attempt in range(20):
        g, r = check.generator(92 + 1000 * attempt), check.rng(93 + 1000 * attempt)
        every = r.choice([10, 20, 25]) if check.grading else 10
        flip = r.random() < 0.5 if check.grading else False
        K = r.randint(30, 50) if check.grading else 41
        x = torch.linspace(-6, 6, K, dtype=torch.float64)
        middle = r.uniform(-2, 2) if check.grading else 0.8
        smooth = 0.05 + 0.7 * torch.sigmoid(2 * (x - middle)) + 0.01 * torch.randn(K, generator=g, dtype=torch.float64)
        made = [("stage 1 of 4 (a rise that crosses the threshold and falls back)", *_blips(r, falling=flip)),
                ("stage 2 of 4 (a falling loss that crosses the threshold and comes back)",
                 *_blips(r, falling=not flip)),
                ("stage 3 of 4 (a curve that dips below its start and overshoots its end)", *_ramp(r, falling=flip)),
                ("stage 4 of 4 (a smooth rise)", smooth, 0.1 if check.grading and r.random() < 0.5 else 0.5)]
        cases = [(stage, [every * k for k in range(len(c))], c, f) for stage, c, f in made]
        right = [_first_from(s, _past(c, float(c[0]) + f * (float(c[-1]) - float(c[0])), float(c[-1]) < float(c[0])))
                 for _, s, c, f in cases]
        if not unseparated(right, [_onset_mistakes(s, c, f, smoothing=False) for _, s, c, f in cases], _same_step):
            break
    return cases


def _same_step(a, b) -> bool:
    return a == b


def _check_onset(onset_step, check: Check) -> None:
    cases, got, raised = _onset_cases(check), [], None
    for stage, steps, curve, fraction in cases:
        label = f"steps (every {steps[1]}, {len(steps)} of them), curve [{len(steps)}], fraction={fraction}"
        try:
            value = check.call(onset_step, list(steps), curve.clone(), fraction, label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        got.append(None if value is None else expect_whole(value, f"{stage}, onset_step({label}): the result"))
    cases = cases[:len(got)]
    wants = [check.reference(list(steps), curve.clone(), fraction) for _, steps, curve, fraction in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    stage, steps, curve, fraction = cases[bad]
    label = f"steps (every {steps[1]}, {len(steps)} of them), curve [{len(steps)}], fraction={fraction}"
    message = consistent_mistake(got, wants, [_onset_mistakes(s, c, f) for _, s, c, f in cases], _same_step)
    first, last = float(curve[0]), float(curve[-1])
    if message is None and got[bad] is None:
        message = (f"the curve does come {fraction:g} of the way (its last value is all of the way)"
                   + ("; this curve falls (a loss): past the threshold means at or below it" if last < first else ""))
    elif message is None:
        threshold = first + fraction * (last - first)
        past = _past(curve, threshold, last < first).tolist()
        k = steps.index(got[bad]) if got[bad] in steps else None
        message = ("that is not one of the recorded steps" if k is None else
                   f"the curve is not past the threshold at step {got[bad]}" if not past[k] else
                   f"the curve falls back at step {steps[k + past[k:].index(False)]}, after step {got[bad]}"
                   if not all(past[k:]) else "the curve is already past the threshold for good at an earlier step")
        message += ": return the first step from which it stays at or past first + fraction * (last - first)"
    raise Wrong(f"{stage}, onset_step({label}): got {got[bad]}; {message}")


register(Exercise(
    "11", 2, "the onset step of a recorded curve",
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
def _best(scores: torch.Tensor, layers, *, read: str = "last") -> tuple[int, int] | None:
    """(layer, head) of the highest score among ``layers``, read at the last step (or its ``max`` or ``mean`` over
    the steps: mistakes); None when there is no such layer."""
    layers = list(layers)
    if not layers:
        return None
    at = {"last": lambda t: t[-1], "max": lambda t: t.amax(0), "mean": lambda t: t.mean(0)}[read](scores)[layers]
    layer, head = divmod(int(at.argmax()), at.size(1))
    return (layers[layer], head)


def _circuit(induction, previous, *, i_read="last", i_layers=None, p_read="last", p_layers=None):
    """The pair a reading gives: the induction head among ``i_layers`` (default layers 1 and up), then the
    previous-token head among ``p_layers(induction layer)`` (default the layers below it)."""
    N = induction.size(1)
    head = _best(induction, range(1, N) if i_layers is None else i_layers, read=i_read)
    below = range(head[0]) if p_layers is None else p_layers(head[0])
    return (head, _best(previous, below, read=p_read))  # (a previous-token head of None: no layer below)


def _circuit_mistakes(induction, previous) -> dict:
    """{message: the pair that mistake gives} for one recording."""
    N = induction.size(1)
    (il, ih), (pl, ph) = right = _circuit(induction, previous)
    def induction_only(reading):  # a mistake in the induction head: whichever previous-token head follows from it
        return (reading[0], None)

    return {
        "the pairs are (layer, head), in that order": ((ih, il), (ph, pl)),
        "the induction head comes first, then the previous-token head": (right[1], right[0]),
        "that head's induction score peaked mid-way and faded; name the head with the highest score at the *last* "
        "recorded step": induction_only(_circuit(induction, previous, i_read="max")),
        "that is the head with the highest induction score on average over the steps; name the one with the highest "
        "score at the *last* recorded step (a head can lead for most of training and fade)":
            induction_only(_circuit(induction, previous, i_read="mean")),
        "the induction head need not be in the last layer: look in every layer from 1 up":
            induction_only(_circuit(induction, previous, i_layers=[N - 1])),
        "a layer-0 head has no layer below it to compose with: look for the induction head in layers 1 and up":
            (_best(induction, range(N)), None),
        "the previous-token head must sit in a layer *below* the induction head (its keys read what the layer below "
        "wrote)": _circuit(induction, previous, p_layers=lambda layer: range(N)),
        "the previous-token head sits in a layer below the induction head, not in its own layer":
            _circuit(induction, previous, p_layers=lambda layer: range(layer + 1)),
        "the previous-token head may sit in any layer below the induction head, not only the one just below":
            _circuit(induction, previous, p_layers=lambda layer: [layer - 1]),
        "that previous-token head's score peaked and faded; name the head with the highest score at the *last* "
        "recorded step": _circuit(induction, previous, p_read="max"),
        "that is the head with the highest previous-token score on average over the steps; name the one with the "
        "highest score at the *last* recorded step": _circuit(induction, previous, p_read="mean"),
    }


def _recording(r, g, N: int, H: int, il: int, pl: int, K: int = 21) -> tuple[torch.Tensor, torch.Tensor]:
    """Induction and previous-token scores [K, N, H]: the induction head in layer ``il`` and its previous-token
    head in layer ``pl`` rise during training; beside them every head a reading can take instead: one that peaks
    mid-way and fades, one that leads most of training and fades, a high head in layer 0, a lower head in the last
    layer, previous-token heads above the induction head, in its layer and in the layer just below."""
    ramp = torch.linspace(0, 1, K)
    induction = 0.05 + 0.1 * torch.rand(K, N, H, generator=g)
    previous = 0.05 + 0.1 * torch.rand(K, N, H, generator=g)
    ih, ph = r.randrange(H), r.randrange(H)
    induction[:, il, ih] += 0.6 * ramp                                        # ends near 0.7
    previous[:, pl, ph] += 0.5 * ramp                                         # ends near 0.6

    def other(layer, *taken):
        return r.choice([(layer, h) for h in range(H) if (layer, h) not in taken])

    peak = other(r.randrange(1, N), (il, ih))
    induction[K // 2, peak[0], peak[1]] = 0.95                                # peaks mid-way, then fades
    lead = other(r.randrange(1, N), (il, ih), peak)
    induction[: 4 * K // 5, lead[0], lead[1]] = 0.68                          # leads most of training, then fades
    induction[4 * K // 5:, lead[0], lead[1]] = 0.1
    induction[:, 0, r.randrange(H)] += 0.9 * ramp                             # layer 0: highest, nothing below it
    if il < N - 1:                                                            # the last layer: lower than il's head
        induction[:, N - 1, r.randrange(H)] += 0.4 * ramp
    previous[:, r.randrange(il, N), r.randrange(H)] += 0.8 * ramp            # at or above the induction head
    previous[:, il, r.randrange(H)] += 0.7 * ramp                             # in the induction head's own layer
    if pl < il - 1:
        previous[:, il - 1, r.randrange(H)] += 0.3 * ramp                     # just below, lower than pl's head
    p_peak = other(r.randrange(il), (pl, ph))
    previous[K // 2, p_peak[0], p_peak[1]] = 0.95                             # a previous-token head that faded
    p_lead = other(r.randrange(il), (pl, ph), p_peak)
    previous[: 4 * K // 5, p_lead[0], p_lead[1]] = 0.58
    previous[4 * K // 5:, p_lead[0], p_lead[1]] = 0.1
    return induction, previous


def _circuit_cases(check: Check) -> list:
    """(stage, induction [K, N, H], previous [K, N, H]): two layers, three with the induction head in the middle,
    four with its previous-token head two layers below it; when grading, layers and heads drawn fresh (the induction
    head in any layer from 1 up, its previous-token head in any below), redrawn until every mistake gives a pair of
    its own on some case."""
    for attempt in range(20):
        g, r = check.generator(94 + 1000 * attempt), check.rng(95 + 1000 * attempt)
        if check.grading:
            shapes = []
            for stage in range(3):
                N = r.randint(2, 5)
                il = r.randint(1, N - 1)
                shapes.append((N, r.randint(3, 6), il, r.randrange(il)))
        else:
            shapes = [(2, 4, 1, 0), (3, 5, 1, 0), (4, 4, 2, 0)]
        cases = [(f"stage {n + 1} of 3 ({N} layers, the induction head in layer {il})",
                  *_recording(r, g, N, H, il, pl)) for n, (N, H, il, pl) in enumerate(shapes)]
        right = [_circuit(i, p) for _, i, p in cases]
        if not unseparated(right, [_circuit_mistakes(i, p) for _, i, p in cases], _same_pair):
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


def _check_circuit(circuit_heads, check: Check) -> None:
    cases, got, raised = _circuit_cases(check), [], None
    for stage, induction, previous in cases:
        K, N, H = induction.shape
        label = f"induction [{K}, {N}, {H}], previous [{K}, {N}, {H}]"
        try:
            pairs = _pairs(check.call(circuit_heads, induction.clone(), previous.clone(), label=label))
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if pairs is None:
            raise Wrong(f"{stage}, circuit_heads({label}): return ((layer, head), (layer, head)): the induction head, "
                        "then the previous-token head")
        got.append(pairs)
    cases = cases[:len(got)]
    wants = [check.reference(induction.clone(), previous.clone()) for _, induction, previous in cases]
    wants = [tuple(tuple(int(v) for v in pair) for pair in want) for want in wants]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    stage, induction, previous = cases[bad]
    K, N, H = induction.shape
    message = consistent_mistake(got, wants, [_circuit_mistakes(i, p) for _, i, p in cases], _same_pair)
    if message is None:
        message = ("the induction head is right; the previous-token head is the head with the highest final "
                   "previous-token score in the layers below it" if got[bad][0] == wants[bad][0] else
                   "the induction head is the head with the highest induction score at the last step in layers 1 and "
                   "up; the previous-token head the one with the highest final score in the layers below it")
    raise Wrong(f"{stage}, circuit_heads(induction [{K}, {N}, {H}], previous [{K}, {N}, {H}]): {message}")


register(Exercise(
    "11", 3, "which heads are the induction head and its previous-token head",
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
