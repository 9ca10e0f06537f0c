"""Exercises of notebook 10 (what heads compute): a head's QK circuit and its rank, the copying score of an OV
circuit, and one head's direct logit attribution.

Exercise 1 runs on small hidden models (mhalab's toy ``Transformer``), staged: the paper's attention, grouped-query
attention, and a head of lower rank than its width; exercise 2 on small random embeddings, head and unembedding
matrices (one that copies, one that suppresses, random ones); exercise 3 on random head outputs, norm scales and
unembeddings. When grading, the values are drawn fresh and more cases added. Any code may run.
"""

from __future__ import annotations

import math

import torch

from .calls import Check
from .checks import expect_equal, judge, name_miss
from .core import Exercise, register
from .verdicts import Wrong

# ------------------------------------------------------------------------------------ exercise 1
_QK_MODELS = [
    ("stage 1 of 3 (multi-head attention)", dict(d_vocab=11, d_model=12, n_heads=3, n_layers=2), 101, 1, 1),
    ("stage 2 of 3 (grouped-query: 4 query heads share 2 K/V heads)",
     dict(d_vocab=11, d_model=16, n_heads=4, n_key_value_heads=2, n_layers=2), 102, 0, 2),
    ("stage 3 of 3 (a head whose rank is below d_head)",
     dict(d_vocab=11, d_model=16, n_heads=4, n_key_value_heads=1, d_head=6, n_layers=1), 103, 0, 1),
]


def _qk_cases(check: Check) -> list:
    """(stage, model, layer, head): the paper's attention, grouped-query, a low-rank head; more drawn when grading."""
    cases = []
    for stage, config, seed, layer, head in _QK_MODELS:
        model = check.hidden_model({**config, "n_ctx": 8, "causal": True, "bias": False}, seed)
        if "low" in stage or "rank" in stage:  # head 1 keeps only 3 of its 6 query directions
            d = model.config.d_head
            with torch.no_grad():
                model.blocks[layer].attn.qkv_proj.weight[head * d + 3:(head + 1) * d] = 0.0
        cases.append((stage, model, layer, head))
    if check.grading:
        r = check.rng(104)
        g = r.choice([1, 2])
        config = dict(d_vocab=9, d_model=r.choice([16, 24]), n_heads=2 * g, n_key_value_heads=g,
                      d_head=r.choice([3, 5]), n_layers=2, n_ctx=8, causal=True, bias=False)
        cases.append(
            ("a model drawn for this grading", check.hidden_model(config, 105), r.randrange(2), r.randrange(2 * g))
        )
    return cases


def _check_qk(qk_circuit, check: Check) -> None:
    for stage, model, layer, head in _qk_cases(check):
        attn = model.blocks[layer].attn
        H, G, d = attn.n_heads, attn.n_kv_heads, attn.d_head
        label = (f"{stage}, qk_circuit(a model with {H} heads, {G} K/V heads, d_model {attn.d_model}, d_head {d}, "
                 f"layer={layer}, head={head})")
        got = check.call(qk_circuit, model, layer, head, label=label, copy_args=False)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"{label}: return two things, (W_QK, rank)")
        W_QK, rank = got
        want, want_rank = check.reference(model, layer, head)
        want = want.detach()
        p = attn.head_projections(head)

        def mistakes():
            out = {"that is W_K W_Qᵀ, the transpose: the query side comes first, W_QK = W_Q W_Kᵀ": want.T,
                   "W_QK is W_Q W_Kᵀ itself, without the 1/sqrt(d_head) the attention scores get":
                       want / math.sqrt(d)}
            if G != H:
                wrong_kv = head % G
                W_K = attn.qkv_proj.weight[(H + wrong_kv) * d:(H + wrong_kv + 1) * d].T
                out[f"that W_K is K/V head {wrong_kv}'s; query head j reads K/V head j // (H // G) "
                    f"(head_projections picks it for you)"] = (p.W_Q @ W_K.T).detach()
            return out

        if hasattr(W_QK, "shape") and tuple(W_QK.shape) == (d, d) != tuple(want.shape):
            raise Wrong(f"{label}: W_QK has shape [{d}, {d}], [d_head, d_head]; W_Q and W_K are [d_model, d_head], "
                        "so W_Q W_Kᵀ is [d_model, d_model]")
        judge(W_QK, want, f"{label}, W_QK", mistakes)
        if not isinstance(rank, (int, float)) and not (hasattr(rank, "numel") and rank.numel() == 1):
            raise Wrong(f"{label}: the rank should be one whole number, got {type(rank).__name__}")
        miss = name_miss(int(rank), [
            (d, f"the rank is at most d_head = {d}, not always equal to it: compute it (torch.linalg.matrix_rank)"),
            (attn.d_model, "that is d_model, the size of the matrix, not its rank (if you computed it in float64 "
                           "from float32 weights, rounding noise fills the other directions: stay in their dtype)"),
        ]) if int(rank) != want_rank else None
        if miss:
            raise Wrong(f"{label}: rank {int(rank)}; {miss}")
        expect_equal(rank, want_rank, f"{label}: the rank")


register(Exercise(
    "10", 1, "a head's QK circuit and its rank",
    _check_qk,
    hint=["model.blocks[layer].attn.head_projections(head) gives W_Q and W_K, each [d_model, d_head] (under "
          "grouped-query attention W_K is already the K/V head this query head reads).",
          "W_QK = W_Q @ W_K.T is [d_model, d_model]; torch.linalg.matrix_rank(W_QK) counts its directions. Return "
          "both: return W_QK, int(rank)."],
    solution=(
        "def qk_circuit(model, layer, head):\n"
        "    p = model.blocks[layer].attn.head_projections(head)   # W_Q, W_K: [d_model, d_head]\n"
        "    W_QK = p.W_Q @ p.W_K.T                                 # [d_model, d_model]\n"
        "    return W_QK, int(torch.linalg.matrix_rank(W_QK))"
    ),
    minutes=15, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
def _ov_cases(check: Check) -> list:
    """(what, W_E, W_V, W_O, W_U) in float64; W_U from W_E for one that copies and one that suppresses."""
    g = check.generator(110)
    sizes = [(10, 6, 3), (12, 8, 2), (9, 6, 4)]
    if check.grading:
        r = check.rng(111)
        sizes += [(r.randint(6, 16), r.randint(4, 8), r.randint(1, 4)) for _ in range(2)]
    cases = []
    for n, (V, D, d) in enumerate(sizes):
        W_E, W_V, W_O = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((V, D), (D, d), (d, D)))
        if n == 0:  # a head that copies: W_O undoes W_V on its subspace, W_U reads the embedding back
            W_U, W_O, what = W_E.T.clone(), torch.linalg.pinv(W_V), "a head that copies"
        elif n == 1:
            W_U, W_O, what = -W_E.T, torch.linalg.pinv(W_V), "a head that suppresses"
        else:
            W_U, what = torch.randn(D, V, generator=g, dtype=torch.float64), "random matrices"
        cases.append((what, W_E, W_V, W_O, W_U))
    return cases[2:] + cases[:2]  # random ones first: there every mistake gives its own value


def _copying(M: torch.Tensor) -> float:
    lam = torch.linalg.eigvals(M)
    return float(lam.real.sum() / lam.abs().sum())


def _check_copying(copying_score, check: Check) -> None:
    for what, W_E, W_V, W_O, W_U in _ov_cases(check):
        shapes = ", ".join(f"{n} {list(m.shape)}" for n, m in zip(("W_E", "W_V", "W_O", "W_U"), (W_E, W_V, W_O, W_U)))
        label = f"copying_score({shapes}) ({what})"
        got = check.call(copying_score, W_E, W_V, W_O, W_U, label=label)
        full = W_E @ W_V @ W_O @ W_U
        lam = torch.linalg.eigvals(full)
        judge(got, check.reference(W_E, W_V, W_O, W_U), label, lambda: {
            "that is the copying score of W_V W_O alone; the full OV circuit runs from the embedding to the "
            "unembedding, W_E W_V W_O W_U": _copying(W_V @ W_O),
            "singular values are never negative, so their score is always 1: use the eigenvalues "
            "(torch.linalg.eigvals)": 1.0,
            "divide by the moduli |λ| (eigenvalues.abs()), not by |Re λ|": float(lam.real.sum() / lam.real.abs().sum()),
            "that is the sum of the real parts alone; divide it by the sum of the moduli |λ|": float(lam.real.sum()),
        })


register(Exercise(
    "10", 2, "the copying score of an OV circuit",
    _check_copying,
    hint=["The full OV circuit is the [V, V] matrix W_E @ W_V @ W_O @ W_U: row t is what the head adds to every "
          "logit when it attends to token t.",
          "torch.linalg.eigvals gives its (complex) eigenvalues λ; the score is λ.real.sum() / λ.abs().sum()."],
    solution=(
        "def copying_score(W_E, W_V, W_O, W_U):\n"
        "    eigenvalues = torch.linalg.eigvals(W_E @ W_V @ W_O @ W_U)    # [V], complex\n"
        "    return float(eigenvalues.real.sum() / eigenvalues.abs().sum())"
    ),
    minutes=15, difficulty=3, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 3
def _dla_cases(check: Check) -> list:
    g = check.generator(120)
    sizes = [(2, 5, 8, 11), (1, 7, 6, 9)]
    if check.grading:
        r = check.rng(121)
        sizes += [(r.randint(1, 3), r.randint(2, 9), r.randint(4, 12), r.randint(5, 20))]
    cases = []
    for B, T, D, V in sizes:
        result = torch.randn(B, T, D, generator=g, dtype=torch.float64)
        scale = torch.rand(B, T, 1, generator=g, dtype=torch.float64) * 3 + 0.5  # the norm's divisor, away from 1
        W_U = torch.randn(D, V, generator=g, dtype=torch.float64)
        right, wrong = (torch.randint(0, V, (B, T), generator=g) for _ in "rw")
        cases.append((result, scale, W_U, right, wrong))
    return cases


def _dla(result, scale, W_U, right, wrong):
    return ((result / scale) * (W_U.T[right] - W_U.T[wrong])).sum(-1)


def _check_dla(head_logit_attribution, check: Check) -> None:
    for result, scale, W_U, right, wrong in _dla_cases(check):
        B, T, D = result.shape
        label = (f"head_logit_attribution(result [{B}, {T}, {D}], scale [{B}, {T}, 1], W_U [{D}, {W_U.shape[1]}], "
                 "right, wrong)")
        got = check.call(head_logit_attribution, result, scale, W_U, right, wrong, label=label)
        own = result.pow(2).mean(-1, keepdim=True).sqrt()
        judge(got, check.reference(result, scale, W_U, right, wrong), label, lambda: {
            "divide the head's output by the final norm's scale first: the logits are computed from the normed "
            "residual":
                _dla(result, 1.0, W_U, right, wrong),
            "divide by the scale, do not multiply: the norm divides the residual by it":
                _dla(result, 1 / scale, W_U, right, wrong),
            "that is the head's share of the right token's logit alone; subtract the wrong token's (project on "
            "W_U[:, right] - W_U[:, wrong])": ((result / scale) * W_U.T[right]).sum(-1),
            "the sign is flipped: right minus wrong, not wrong minus right": -_dla(result, scale, W_U, right, wrong),
            "the scale is the final norm's on the whole residual (given as scale), not the RMS of this head's "
            "own output":
                _dla(result, own, W_U, right, wrong),
        })


register(Exercise(
    "10", 3, "one head's direct logit attribution",
    _check_dla,
    hint=["The final norm divides the whole residual, this head's output included, by scale; W_U then makes the "
          "logits. So the head's direct share of the logits is (result / scale) @ W_U.",
          "Only the logit difference is asked: project result / scale on W_U[:, right] - W_U[:, wrong] "
          "(W_U.T[right] - W_U.T[wrong] is [batch, pos, d_model]) and sum over d_model."],
    solution=(
        "def head_logit_attribution(result, scale, W_U, right, wrong):\n"
        "    direction = W_U.T[right] - W_U.T[wrong]          # [batch, pos, d_model]\n"
        "    return ((result / scale) * direction).sum(-1)    # [batch, pos]"
    ),
    minutes=15, difficulty=3, importance=4,
))
