"""What a head reads and writes, from its weights: QK and OV circuits (Elhage et al. 2021), in TransformerLens's terms.

A head's query-key circuit ``W_QK = W_Q W_Kᵀ`` and output-value circuit ``W_OV = W_V W_O`` are D x D matrices of
rank at most d_head. They are kept as :class:`~mhalab.factored_matrix.FactoredMatrix` products, so ranks, norms,
singular values and eigenvalues come from d_head x d_head matrices and no D x D (or V x V) matrix is formed.
Row-vector convention, as TransformerLens: a residual ``x [D]`` gives the query ``x @ W_Q``; the attention score of
query ``x`` on key ``y`` is ``x @ W_QK @ yᵀ``, and what a head writes for the token it reads is ``y @ W_OV``.

The weights are read as TransformerLens reads them after ``fold_ln`` (:mod:`mhalab.head_weights` says how). These
are the functions the models' ``model.QK``, ``model.OV`` and ``model.all_composition_scores`` call. Grouped-query
models: query head h reads K/V head ``h // (H // G)``, and ``QK``, ``OV`` and the composition scores repeat the K/V
heads per query head. :func:`direct_logit_attribution` and :func:`logit_lens` read activations, through the final
norm and the unembedding. Shapes: N layers, H query heads, G K/V heads, D d_model, d d_head, V vocabulary,
P positions, B batch, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .arguments import validate_index, validate_int
from .factored_matrix import FactoredMatrix
from .head_weights import (
    _NO_UNEMBEDDING,
    HeadWeights,
    _attention_weights,
    _validate_transformer,
    head_weights,
    unembedding_weights,
)

__all__ = [
    "QK", "OV", "full_qk_circuit", "positional_qk_circuit", "full_ov_circuit", "composition_scores",
    "all_composition_scores", "composition_baseline", "copying_score", "direct_logit_attribution", "logit_lens",
]


def _weights(model) -> HeadWeights:
    return model if isinstance(model, HeadWeights) else head_weights(model)


def _head(w: HeadWeights, layer: int, head: int) -> tuple[int, int]:
    N, H = w.W_Q.shape[:2]
    return (validate_index("layer", layer, N, valid=f"the model has {N} layers,"),
            validate_index("head", head, H, valid=f"each layer has {H} heads,"))


def _per_query_head(W: Tensor, H: int) -> Tensor:
    """K/V weights ``[N, G, ...]`` listed per query head ``[N, H, ...]``: query head h reads K/V head h // (H // G)."""
    return W.repeat_interleave(H // W.size(1), dim=1)


def _unembedding(w: HeadWeights) -> Tensor:
    if w.W_U is None:
        raise ValueError(_NO_UNEMBEDDING)
    return w.W_U


# ---------------------------------------------------------------------------- circuits
def QK(model) -> FactoredMatrix:
    """Every head's ``W_QK = W_Q W_Kᵀ``: ``[N, H, D, D]`` (TransformerLens's ``model.QK``)."""
    W_Q, W_K, _, _ = _attention_weights(model)
    return _qk(W_Q, W_K)


def OV(model) -> FactoredMatrix:
    """Every head's ``W_OV = W_V W_O``: ``[N, H, D, D]`` (TransformerLens's ``model.OV``)."""
    _, _, W_V, W_O = _attention_weights(model)
    return _ov(W_V, W_O)


def _qk(W_Q: Tensor, W_K: Tensor) -> FactoredMatrix:
    return FactoredMatrix(W_Q, _per_query_head(W_K, W_Q.size(1)).transpose(-2, -1))  # [N, H, D, d] [N, H, d, D]


def _ov(W_V: Tensor, W_O: Tensor) -> FactoredMatrix:
    return FactoredMatrix(_per_query_head(W_V, W_O.size(1)), W_O)  # [N, H, D, d] [N, H, d, D]


def _qkv(w: HeadWeights, layer: int, head: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Head ``(layer, head)``'s ``W_Q, W_K, W_V [D, d]`` (its K/V head's) and ``W_O [d, D]``."""
    l, h = _head(w, layer, head)
    g = h // (w.W_Q.size(1) // w.n_key_value_heads)  # the K/V head it reads
    return w.W_Q[l, h], w.W_K[l, g], w.W_V[l, g], w.W_O[l, h]


def full_qk_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_E W_QK W_Eᵀ [V, V]``: the score a query token gives a key token, from the token embeddings alone."""
    w = _weights(model)
    W_Q, W_K, _, _ = _qkv(w, layer, head)
    return FactoredMatrix(w.W_E @ W_Q, (w.W_E @ W_K).T)


def positional_qk_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_pos W_QK W_posᵀ [P, P]``: the score query position i gives key position j, from the position table."""
    w = _weights(model)
    W_Q, W_K, _, _ = _qkv(w, layer, head)
    if w.W_pos is None:
        raise ValueError("this model has no position table (rotary or no positions), so no positional QK circuit")
    return FactoredMatrix(w.W_pos @ W_Q, (w.W_pos @ W_K).T)


def full_ov_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_E W_OV W_U [V, V]``: row t says which logits the head raises when it attends to token t."""
    w = _weights(model)
    _, _, W_V, W_O = _qkv(w, layer, head)
    return FactoredMatrix(w.W_E @ W_V, W_O @ _unembedding(w))


def _orthonormal_sides(left: FactoredMatrix, right: FactoredMatrix) -> tuple[Tensor, Tensor]:
    """``L [..., m1, r]`` and ``R [..., l, m2]`` with ``||left @ X @ right|| = ||L @ X @ R||`` for any X: the QR
    factors ``A1 = Q1 R1`` and ``B2ᵀ = Q2 R2`` have orthonormal columns, so ``L = R1 B1``, ``R = A2 R2ᵀ``."""
    R1 = torch.linalg.qr(left.A, mode="r")[1]  # [..., m1, m1] (Q1 is not needed, nor formed)
    R2 = torch.linalg.qr(right.B.transpose(-2, -1), mode="r")[1]  # [..., m2, m2]
    return R1 @ left.B, right.A @ R2.transpose(-2, -1)


def composition_scores(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """Elhage et al.'s ``||left @ right||_F / (||left||_F ||right||_F)``, over broadcast leading axes.

    ``left = A1 B1``, ``right = A2 B2``: with ``A1 = Q1 R1`` and ``B2ᵀ = Q2 R2`` (QR), ``||A1 B1 A2 B2||`` is
    ``||(R1 B1)(A2 R2ᵀ)||``, an m1 x m2 matrix, so no D x D matrix is formed."""
    if left.rdim != right.ldim:
        raise ValueError(f"left [{left.ldim} x {left.rdim}] and right [{right.ldim} x {right.rdim}] do not chain")
    L, R = _orthonormal_sides(left, right)  # [..., m1, D], [..., D, m2]
    return (L @ R).norm(dim=(-2, -1)) / (L.norm(dim=(-2, -1)) * R.norm(dim=(-2, -1)))


_MODES = {"Q": lambda qk, ov: qk, "K": lambda qk, ov: qk.T, "V": lambda qk, ov: ov}


def all_composition_scores(model, mode: str) -> Tensor:
    """``[N, H, N, H]``: how much head (l1, h1)'s OV output feeds head (l2, h2)'s queries (``"Q"``), keys
    (``"K"``) or values (``"V"``); 0 unless l1 < l2 (TransformerLens's ``model.all_composition_scores``)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be 'Q', 'K' or 'V' (which input of the later head reads the earlier one's "
                         f"output), got {mode!r}")
    W_Q, W_K, W_V, W_O = _attention_weights(model)
    N, H = W_Q.shape[:2]
    ov = _ov(W_V, W_O)
    L, R = _orthonormal_sides(ov, _MODES[mode](_qk(W_Q, W_K), ov))  # [N, H, m, D], [N, H, D, m]
    L_norm, R_norm = L.norm(dim=(-2, -1)), R.norm(dim=(-2, -1))  # [N, H]
    scores = torch.zeros(N, H, N, H, dtype=W_Q.dtype)
    for l in range(N - 1):  # one source layer at a time, into every later one: one matrix product
        product = torch.einsum("hmd,lkdn->hlkmn", L[l], R[l + 1:])  # [H, later, H, m, m]
        scores[l, :, l + 1:] = product.norm(dim=(-2, -1)) / (L_norm[l][:, None, None] * R_norm[l + 1:])
    return scores


def composition_baseline(d_model: int, d_head: int, n: int = 256, *, seed: int = 0) -> Tensor:
    """``[n]`` composition scores of random products of Gaussian matrices of a head's shapes (``[D, d] [d, D]``,
    rank d), the baseline Elhage et al. compare with; their mean square is close to 1 / d_model."""
    validate_int("d_head", d_head, 1, maximum=validate_int("d_model", d_model, 1))
    g = torch.Generator().manual_seed(seed)
    A1, A2 = (torch.randn(validate_int("n", n, 1), d_model, d_head, generator=g, dtype=torch.float64) for _ in "12")
    B1, B2 = (torch.randn(n, d_head, d_model, generator=g, dtype=torch.float64) for _ in "12")
    return composition_scores(FactoredMatrix(A1, B1), FactoredMatrix(A2, B2))


def copying_score(circuit: FactoredMatrix) -> Tensor:
    """``sum(Re λ) / sum(|λ|)`` over the eigenvalues λ of a square circuit ``[...]``: +1 when it maps every
    token to itself with positive weight (copies), -1 when it suppresses (Elhage et al. 2021)."""
    lam = circuit.eigenvalues
    return lam.real.sum(-1) / lam.abs().sum(-1)


# ---------------------------------------------------------------------------- on activations
def direct_logit_attribution(model, tokens: Tensor, right: Tensor, wrong: Tensor | None = None) -> Tensor:
    """``[N, H, B, T]``: each head's direct effect on the logit of ``right`` minus that of ``wrong`` (ids
    ``[B, T]``, or ints) at every position, through the final norm's scale: ``cache.stack_head_results(
    apply_ln=True)`` against W_U's columns; without ``wrong``, on the logit of ``right`` minus the mean logit."""
    _validate_transformer(model)
    W_U, _ = unembedding_weights(model)
    N, B, T = len(model.blocks), *tokens.shape
    wanted = lambda name: name.endswith("attn.hook_z") or name == "ln_final.hook_scale"  # noqa: E731
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=wanted)
    stack = cache.stack_head_results(apply_ln=True)  # [N H, B, T, D]
    right = torch.as_tensor(right).expand(B, T)
    direction = W_U.T[right] - (W_U.T[torch.as_tensor(wrong).expand(B, T)] if wrong is not None else W_U.mean(1))
    return (stack * direction).sum(-1).unflatten(0, (N, -1))  # [N H, B, T] -> [N, H, B, T]


def logit_lens(model, tokens: Tensor) -> Tensor:
    """``[N + 1, B, T, V]``: the residual entering every block, then after the last one, through the final norm
    and the unembedding, as if the model ended there (nostalgebraist 2020): ``cache.accumulated_resid(apply_ln=True)
    @ model.W_U + model.b_U``; the last row is the model's logits."""
    _validate_transformer(model)
    W_U, b_U = unembedding_weights(model)
    wanted = lambda name: name.endswith(("hook_resid_pre", "hook_resid_post"))  # noqa: E731
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=wanted)
        logits = cache.accumulated_resid(apply_ln=True) @ W_U  # [N + 1, B, T, D] @ [D, V]
    return logits if b_U is None else logits + b_U
