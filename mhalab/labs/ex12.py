"""Exercises of notebook 12 (what heads compute): a head's QK circuit and its rank, the copying score of an OV
circuit, and one head's direct logit attribution.

Exercise 1 runs on small hidden models (mhalab's toy ``Transformer``), staged: the paper's attention, grouped-query
attention, a head of lower rank than its width, and one whose directions merge; exercise 2 on small random
embeddings, head and unembedding matrices (one that copies, one that suppresses, one that writes the next token,
random ones); exercise 3 on random head outputs, norm scales and unembeddings. When grading, the values are drawn
fresh and more cases added. Any code may run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .calls import Check
from .core import Exercise, register
from .judging import ATOL, RTOL, describe, expect_whole, judge, name_miss
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _kv_maps(H: int, G: int) -> dict[str, Callable[[int], int]]:
    """The K/V head a query head reads, by the right map and by the maps a learner could make up."""
    return {"right": lambda j: j // (H // G), "cycles": lambda j: j % G, "by G": lambda j: j // G}


def _near_degenerate(model, layer: int, head: int, generator: torch.Generator) -> None:
    """Make ``head``'s W_QK of rank 3 with one direction small but well above rounding, and lower in rank than W_Q
    (5) and W_K (4): W_Q's columns are orthogonal directions a_i u_i, W_K's b_i v_i, so W_QK = sum_i a_i b_i u_i v_iᵀ
    has the singular values a_i b_i. Query direction 0 and key directions 1 and 2 are zero (W_QK keeps 3, 4 and 5);
    direction 3 is tiny: its singular value is 3 x the rounding of a float32 W_QK (max(shape) x eps x the largest, the
    tolerance of torch.linalg.matrix_rank), so the rank counts it and any relative tolerance of 1e-5 or looser misses
    it. The head's K/V head is shared by its group (and every head when there is one K/V head): their W_QK lose key
    directions 1 and 2 too."""
    attn = model.blocks[layer].attn
    H, G, d, D = attn.n_heads, attn.n_key_value_heads, attn.d_head, attn.d_model
    u, _ = torch.linalg.qr(torch.randn(D, d, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(D, d, generator=generator, dtype=torch.float64))
    tiny = 3 * D * torch.finfo(torch.float32).eps * 1.5  # x the largest singular value, a_4 b_4
    a = torch.tensor([0.0, 1.0, 1.0, tiny ** 0.5, 1.5, 1.0], dtype=torch.float64)[:d]
    b = torch.tensor([1.0, 0.0, 0.0, tiny ** 0.5, 1.0, 0.6], dtype=torch.float64)[:d]
    w = attn.qkv_proj.weight.view(H + 2 * G, d, D)
    with torch.no_grad():
        w[head] = (u * a).T.to(w.dtype)                                 # W_Q = u diag(a): [D, d]
        w[H + head // (H // G)] = (v * b).T.to(w.dtype)                 # W_K = v diag(b)


def _merged(model, layer: int, head: int, generator: torch.Generator, swap: bool = False) -> None:
    """Make ``head``'s W_QK lower in rank than W_Q and W_K through directions that merge, not only through zero ones:
    q_0 and q_1 point the same way (k_0, k_1 do not), k_2 and k_3 do (q_2, q_3 do not), q_4 k_4 is one term of its
    own, q_5 and q_6 have no key side, the rest neither. So W_QK = u_0 (t_0 v_0 + t_1 v_1)ᵀ + (t_2 u_1 + t_3 u_2) v_2ᵀ
    + t_4 u_3 v_3ᵀ has rank 3, W_Q rank 6 (u_0 .. u_5), W_K rank 4 (v_0 .. v_3), and 5 directions are alive on both
    sides (7 or 8 = d_head): counting them overcounts. ``swap``: the query and key sides exchanged (ranks 4 and 6).
    Exact in float32: each column is a float32 base vector times ±1 or ±2 (exact), so the product of the stored
    weights has rank 3 in exact arithmetic, and float64 (whose rounding floor is 10^-9 of float32's) counts no
    more than float32 does."""
    attn = model.blocks[layer].attn
    H, G, d, D = attn.n_heads, attn.n_key_value_heads, attn.d_head, attn.d_model
    u, v = (torch.randn(D, 6, generator=generator).div(D ** 0.5) for _ in "uv")  # float32 base vectors: [D, 6]
    sign = torch.randint(0, 2, (2, d), generator=generator) * 2 - 1                   # ±1 per column and side
    size = 2.0 ** torch.randint(0, 2, (2, d), generator=generator)                  # 1 or 2: exact multiples
    q_of, k_of = [0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 2, 3, None, None]                 # the base each column takes
    W_Q, W_K = torch.zeros(D, d), torch.zeros(D, d)
    for i, (a, b) in enumerate(zip(q_of, k_of)):
        W_Q[:, i] = u[:, a] * sign[0, i] * size[0, i]
        if b is not None:
            W_K[:, i] = v[:, b] * sign[1, i] * size[1, i]
    if swap:
        W_Q, W_K = W_K, W_Q
    w = attn.qkv_proj.weight.view(H + 2 * G, d, D)
    with torch.no_grad():
        w[head] = W_Q.T.to(w.dtype)                                     # [d, D]
        w[H + head // (H // G)] = W_K.T.to(w.dtype)


_QK_MODELS = [  # (stage, config, seed, layer, heads probed, the head changed and how, or None)
    ("stage 1 of 5 (multi-head attention)", dict(d_vocab=11, d_model=12, n_heads=3, n_layers=2), 101, 1, [1], None),
    ("stage 2 of 5 (grouped-query: 4 query heads share 2 K/V heads)",
     dict(d_vocab=11, d_model=16, n_heads=4, n_key_value_heads=2, n_layers=2), 102, 0, [0, 1, 2, 3], None),
    ("stage 3 of 5 (grouped-query: 6 query heads share 3 K/V heads)",
     dict(d_vocab=11, d_model=24, n_heads=6, n_key_value_heads=3, d_head=4, n_layers=2), 106, 1, list(range(6)), None),
    ("stage 4 of 5 (a head whose rank is below its width, W_Q's and W_K's)",
     dict(d_vocab=11, d_model=16, n_heads=4, n_key_value_heads=1, d_head=6, n_layers=1), 103, 0, [1, 0],
     (1, "near-degenerate")),
    ("stage 5 of 5 (a head whose directions merge: no more of them zero than before, a lower rank)",
     dict(d_vocab=11, d_model=16, n_heads=3, d_head=8, n_layers=1), 108, 0, [2, 0], (2, "merged")),
]


def _qk_cases(check: Check) -> list:
    """(stage, model, layer, heads): the paper's attention; grouped-query attention with every query head probed, so
    that only the right K/V map passes; a head of rank 3 with a direction near the rounding; a head of rank 3 whose
    directions merge; when grading, the grouped-query models and both changed heads drawn fresh (sizes, groups,
    which head, which side merges)."""
    specs = list(_QK_MODELS)
    swap = False
    if check.grading:
        r = check.rng(104)
        G = r.choice([2, 3])
        H = G * r.choice([2, 3])
        D = r.choice([16, 24])
        specs[1] = (f"stage 2 of 5 (grouped-query: {H} query heads share {G} K/V heads)",
                    dict(d_vocab=9, d_model=D, n_heads=H, n_key_value_heads=G, d_head=r.choice([3, 4, 5]),
                         n_layers=2), 105, r.randrange(2), list(range(H)), None)
        H, G = r.choice([(4, 1), (4, 2), (6, 3)])
        special = r.randrange(H)
        specs[3] = (specs[3][0], dict(d_vocab=9, d_model=r.choice([16, 24]), n_heads=H, n_key_value_heads=G, d_head=6,
                                      n_layers=2), 107, r.randrange(2), [special, (special + 1) % H],
                    (special, "near-degenerate"))
        H, G = r.choice([(3, 3), (4, 2), (4, 4)])
        special, swap = r.randrange(H), r.random() < 0.5
        specs[4] = (specs[4][0], dict(d_vocab=9, d_model=r.choice([16, 24]), n_heads=H, n_key_value_heads=G,
                                      d_head=r.choice([7, 8]), n_layers=2), 109, r.randrange(2),
                    [special, (special + 1) % H], (special, "merged"))
    cases = []
    for stage, config, seed, layer, heads, changed in specs:
        model = check.hidden_model({**config, "n_ctx": 8, "causal": True, "bias": False}, seed)
        if changed is not None and changed[1] == "near-degenerate":
            _near_degenerate(model, layer, changed[0], check.generator(seed + 50))
        elif changed is not None:
            _merged(model, layer, changed[0], check.generator(seed + 50), swap)
        cases.append((stage, model, layer, heads))
    return cases


def _alive(W_Q: torch.Tensor, W_K: torch.Tensor) -> int:
    """How many of the head's directions have a nonzero column on both sides (a count, not a rank)."""
    return int(((W_Q != 0).any(0) & (W_K != 0).any(0)).sum())


def _rank_mistakes(attn, head: int, W_QK: torch.Tensor) -> list[tuple[int, str]]:
    """(the rank a mistake gives, what it missed) for one head; the first that matches is named."""
    p = attn.head_projections(head)
    rank_q, rank_k = (int(torch.linalg.matrix_rank(w.detach())) for w in (p.W_Q, p.W_K))
    below = ("W_QK = W_Q W_Kᵀ = Σ_i q_i k_iᵀ over the head's directions keeps direction i only where both q_i and "
             "k_i are nonzero, so its rank can be lower than both W_Q's and W_K's: compute it from W_QK")
    out = [(rank_q, f"that is the rank of W_Q alone{' (the smaller of the two ranks, a bound)' * (rank_q < rank_k)}; "
            + below),
           (rank_k, f"that is the rank of W_K alone{' (the smaller of the two ranks, a bound)' * (rank_k < rank_q)}; "
            + below),
           (_alive(p.W_Q.detach(), p.W_K.detach()),
            "that counts the directions alive on both sides (q_i and k_i nonzero), but directions that are alive can "
            "still merge: terms of Σ_i q_i k_iᵀ whose q_i point the same way (or whose k_i do) add up to fewer "
            "directions than terms, so the count overcounts: compute the rank of W_QK (torch.linalg.matrix_rank)"),
           (attn.d_head, f"the rank is at most d_head = {attn.d_head}, not always equal to it: compute it "
                         "(torch.linalg.matrix_rank)"),
           (attn.d_model, "that is d_model, the size of the matrix, not its rank (if you took the product in "
                          "float32 and then its rank in float64, the float32 rounding noise fills the other "
                          "directions: take the rank in the dtype of the product)")]
    for rtol in (1e-5, 1e-4, 1e-3, 1e-2):
        out.append((int(torch.linalg.matrix_rank(W_QK.double(), rtol=rtol)), "a direction of W_QK whose singular value "
                    "is small but well above rounding was not counted: your tolerance is looser than the rounding of "
                    "the computation (torch.linalg.matrix_rank's default: max(shape) x eps of W_QK's dtype x its "
                    "largest singular value)"))
    return out


def _check_qk(qk_circuit, check: Check) -> None:
    for stage, model, layer, heads in _qk_cases(check):
        attn = model.blocks[layer].attn
        H, G, d = attn.n_heads, attn.n_key_value_heads, attn.d_head
        for head in heads:
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
                if hasattr(model, "QK"):  # section 1's tool, whose matrices have the LayerNorm folded in
                    out["`model.QK` folds the LayerNorm in; this asks for the weights as stored, from "
                        "`head_projections`"] = model.QK[layer, head].AB.detach()
                w = attn.qkv_proj.weight.detach().view(H + 2 * G, d, attn.d_model)
                for name, kv in _kv_maps(H, G).items():
                    g = kv(head)
                    if name != "right" and g != head // (H // G) and g < G:
                        out[f"that W_K is K/V head {g}'s; query head j reads K/V head j // (H // G), here "
                            f"{head // (H // G)} (head_projections picks it for you)"] = p.W_Q.detach() @ w[H + g]
                return out

            if hasattr(W_QK, "shape") and tuple(W_QK.shape) == (d, d) != tuple(want.shape):
                raise Wrong(f"{label}: W_QK has shape [{d}, {d}], [d_head, d_head]; W_Q and W_K are [d_model, d_head], "
                            "so W_Q W_Kᵀ is [d_model, d_model]")
            judge(W_QK, want, f"{label}, W_QK", mistakes)
            one = isinstance(rank, (int, float)) or getattr(rank, "numel", lambda: 0)() == 1
            if isinstance(rank, bool) or not one:
                raise Wrong(f"{label}: the rank should be one whole number, got {describe(rank)}")
            rank = expect_whole(rank, f"{label}: the rank")
            if rank != want_rank:
                miss = name_miss(rank, [(v, m) for v, m in _rank_mistakes(attn, head, want) if v != want_rank])
                raise Wrong(f"{label}: rank {rank}; " + (miss or "the rank of W_QK is the number of its singular "
                                                                 "values above the rounding of the computation "
                                                                 "(torch.linalg.matrix_rank)"))


register(Exercise(
    "12", 1, "a head's QK circuit and its rank",
    _check_qk,
    hint=["The prediction: W_Q W_Kᵀ = Σ_i q_i k_iᵀ, one term per direction i of the head (q_i, k_i the i-th columns). "
          "A term is zero when q_i or k_i is; and terms whose q_i point the same way merge into one. Counting "
          "columns is a prediction for one head, not a method: compute the rank of the product.",
          "model.blocks[layer].attn.head_projections(head) gives W_Q and W_K, each [d_model, d_head] (under "
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
def _copying(M: torch.Tensor) -> float:
    lam = torch.linalg.eigvals(M)
    return float(lam.real.sum() / lam.abs().sum())


def _copying_mistakes(W_E, W_V, W_O, W_U) -> dict[str, float]:
    """{message: the score that mistake gives} for one circuit."""
    full = W_E @ W_V @ W_O @ W_U
    lam = torch.linalg.eigvals(full)
    return {
        "that is the copying score of W_V W_O alone; the full OV circuit runs from the embedding to the "
        "unembedding, W_E W_V W_O W_U": _copying(W_V @ W_O),
        "a score of exactly 1 whatever the circuit: the numerator is the sum of the *real parts* Re λ of the "
        "eigenvalues, which can be negative (a head that suppresses scores below 0), over the sum of their moduli "
        "|λ|. A sum of moduli |λ|, or of singular values, over itself is always 1": 1.0,
        "divide by the moduli |λ| (eigenvalues.abs()), not by |Re λ|": float(lam.real.sum() / lam.real.abs().sum()),
        "that is the sum of the real parts alone; divide it by the sum of the moduli |λ|": float(lam.real.sum()),
        "divide by the sum of the moduli of the eigenvalues |λ|, not of the singular values (the nuclear norm)":
            float(lam.real.sum() / torch.linalg.svdvals(full).sum()),
        "the numerator is the sum of the real parts of the eigenvalues, not of their moduli: this divides the sum "
        "of the moduli |λ| by something else": float(lam.abs().sum() / lam.real.abs().sum()),
    }


def _far_apart(values: list[float]) -> bool:
    """Every two of ``values`` differ by far more than the tolerance (so each mistake is told by its value)."""
    return all(abs(a - b) > 100 * (ATOL + RTOL * max(abs(a), abs(b))) for n, a in enumerate(values)
               for b in values[n + 1:])


def _ov_cases(check: Check) -> list:
    """(what, W_E, W_V, W_O, W_U) in float64: random circuits first (drawn, and redrawn a few times at most, until
    every mistake gives a score of its own: eigenvalues that are not all real, so that |λ| is not |Re λ|), then one
    that copies and one that suppresses (W_U from W_E), and one that writes the next token (its full OV circuit a
    cyclic shift, whose eigenvalues are the roots of unity: a score of 0, and |λ| = 1 for every one)."""
    g = check.generator(110)
    sizes = [(9, 6, 4)]
    if check.grading:
        r = check.rng(111)
        sizes = [(r.randint(6, 16), r.randint(4, 8), r.randint(3, 4)) for _ in range(2)]
    cases = []
    for V, D, d in sizes:
        for _ in range(50):
            W_E, W_V, W_O = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((V, D), (D, d), (d, D)))
            W_U = torch.randn(D, V, generator=g, dtype=torch.float64)
            scores = [_copying(W_E @ W_V @ W_O @ W_U), *_copying_mistakes(W_E, W_V, W_O, W_U).values()]
            if _far_apart(scores):
                break
        cases.append(("random matrices", W_E, W_V, W_O, W_U))
    for what, (V, D, d) in (("a head that copies", (10, 6, 3)), ("a head that suppresses", (12, 8, 2))):
        W_E, W_V = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((V, D), (D, d)))
        W_O = torch.linalg.pinv(W_V)  # W_O undoes W_V on its subspace; W_U reads the embedding back (or negated)
        cases.append((what, W_E, W_V, W_O, W_E.T.clone() if "copies" in what else -W_E.T))
    V, D = (7, 9) if check.grading else (6, 8)
    W_E, W_V = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((V, D), (D, V)))
    W_O = torch.linalg.pinv(W_V)  # d_head = V: W_E W_V W_O has full rank V, so W_U can map it onto the shift
    shift = torch.eye(V, dtype=torch.float64).roll(1, dims=1)  # token t -> token t + 1 (mod V)
    cases.append(("a head that writes the next token", W_E, W_V, W_O, torch.linalg.pinv(W_E @ W_V @ W_O) @ shift))
    return cases


def _check_copying(copying_score, check: Check) -> None:
    for what, W_E, W_V, W_O, W_U in _ov_cases(check):
        shapes = ", ".join(f"{n} {list(m.shape)}" for n, m in zip(("W_E", "W_V", "W_O", "W_U"), (W_E, W_V, W_O, W_U)))
        label = f"copying_score({shapes}) ({what})"
        got = check.call(copying_score, W_E, W_V, W_O, W_U, label=label)
        judge(got, check.reference(W_E, W_V, W_O, W_U), label, lambda: _copying_mistakes(W_E, W_V, W_O, W_U))


register(Exercise(
    "12", 2, "the copying score of an OV circuit",
    _check_copying,
    hint=["The prediction: the score reads the eigenvalues' signs, weighted by their size. A map that sends each token "
          "back to itself through a few directions has eigenvalues >= 0 and 0 only; a cyclic shift has the roots of "
          "unity, which sum to 0.",
          "The full OV circuit is the [V, V] matrix W_E @ W_V @ W_O @ W_U: row t is what the head adds to every "
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
    "12", 3, "one head's direct logit attribution",
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
