"""What a head reads and writes, from its weights: QK and OV circuits (Elhage et al. 2021), in TransformerLens's terms.

A head's query-key circuit ``W_QK = W_Q W_Kᵀ`` and output-value circuit ``W_OV = W_V W_O`` are D x D matrices of
rank at most d_head. They are kept as :class:`FactoredMatrix` products, so ranks, norms, singular values and
eigenvalues come from d_head x d_head matrices and no D x D (or V x V) matrix is formed. Row-vector convention, as
TransformerLens: a residual ``x [D]`` gives the query ``x @ W_Q``; the attention score of query ``x`` on key ``y`` is
``x @ W_QK @ yᵀ``, and what a head writes for the token it reads is ``y @ W_OV``.

Weights are read through one adapter per model kind (:func:`head_weights`); with ``fold_ln`` the scale of the
norm before the attention is folded into W_Q, W_K, W_V and that of the final norm into W_U, as TransformerLens
does when loading a model (the norms' centring and biases are left out). Grouped-query models: query head j reads
K/V head ``j // (H // G)``, so W_K and W_V are listed once per query head. Shapes: N layers, H query heads,
D d_model, d d_head, V vocabulary, P positions, B batch, T tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .arguments import check_index, check_int

__all__ = [
    "FactoredMatrix", "HeadWeights", "head_weights", "QK", "OV", "full_qk_circuit", "positional_qk_circuit",
    "full_ov_circuit", "composition_scores", "all_composition_scores", "composition_baseline", "copying_score",
    "head_results", "apply_ln_to_stack", "direct_logit_attribution", "accumulated_resid", "logit_lens",
]


# ---------------------------------------------------------------------------- factored matrices
class FactoredMatrix:
    """The matrix ``A @ B`` kept as its factors: ``A [..., l, m]``, ``B [..., m, r]`` (m the inner width, e.g.
    d_head). ``AB`` forms the product ``[..., l, r]``; everything else works through m x m matrices."""

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.dim() < 2 or B.dim() < 2 or A.size(-1) != B.size(-2):
            raise ValueError(f"a FactoredMatrix needs A [..., l, m] and B [..., m, r] with the same m, got "
                             f"A {tuple(A.shape)} and B {tuple(B.shape)}")
        lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self.A, self.B = A.expand(*lead, *A.shape[-2:]), B.expand(*lead, *B.shape[-2:])
        self.ldim, self.mdim, self.rdim = A.size(-2), A.size(-1), B.size(-1)
        self.shape = torch.Size((*lead, self.ldim, self.rdim))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def AB(self) -> Tensor:
        """The product ``[..., l, r]`` (the one place the full matrix is formed)."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:
        """``B @ A [..., m, m]``: the same nonzero eigenvalues as AB (square only)."""
        if self.ldim != self.rdim:
            raise ValueError(f"BA (and eigenvalues) need a square matrix, this one is {self.ldim} x {self.rdim}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other: FactoredMatrix | Tensor) -> FactoredMatrix:
        if isinstance(other, FactoredMatrix):  # A (B A') B': the inner width stays this one's m
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix:
        return FactoredMatrix(other @ self.A, self.B)

    def __getitem__(self, index) -> FactoredMatrix:
        """Index the leading axes only (``QK(model)[layer, head]``)."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > self.ndim - 2:
            raise IndexError(f"a FactoredMatrix of shape {tuple(self.shape)} indexes its {self.ndim - 2} leading "
                             f"axes only, got {len(index)} indices")
        return FactoredMatrix(self.A[index], self.B[index])

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(U [..., l, k], S [..., k], Vh [..., r, k])`` with ``AB = U diag(S) Vhᵀ`` (TransformerLens's
        convention: Vh holds the right singular vectors as columns), k = min(l, m, r), from QR factors of A and
        Bᵀ and an m x m SVD."""
        if self.mdim > min(self.ldim, self.rdim):  # the factors are no narrower than the product: use it
            U, S, Vt = torch.linalg.svd(self.AB, full_matrices=False)
            return U, S, Vt.transpose(-2, -1)
        Qa, Ra = torch.linalg.qr(self.A)  # [.., l, m], [.., m, m]
        Qb, Rb = torch.linalg.qr(self.B.transpose(-2, -1))  # [.., r, m], [.., m, m]
        Um, S, Vmt = torch.linalg.svd(Ra @ Rb.transpose(-2, -1))  # AB = Qa (Ra Rbᵀ) Qbᵀ
        return Qa @ Um, S, Qb @ Vmt.transpose(-2, -1)

    @property
    def S(self) -> Tensor:
        """Singular values ``[..., k]``, largest first."""
        return self.svd()[1]

    def rank(self, rtol: float | None = None) -> Tensor:
        """Numerical rank ``[...]`` (int): singular values above ``rtol`` times the largest (default as
        ``torch.linalg.matrix_rank``: max(l, r) times the dtype's eps)."""
        S = self.S
        rtol = max(self.ldim, self.rdim) * torch.finfo(S.dtype).eps if rtol is None else rtol
        return (S > rtol * S[..., :1]).sum(-1)

    def norm(self) -> Tensor:
        """Frobenius norm ``[...]``: ``||AB||² = sum((AᵀA) * (BBᵀ))``, two m x m Gram matrices."""
        gram_a = self.A.transpose(-2, -1) @ self.A  # [..., m, m]
        gram_b = self.B @ self.B.transpose(-2, -1)  # [..., m, m]
        return (gram_a * gram_b).sum((-2, -1)).clamp(min=0).sqrt()

    @property
    def eigenvalues(self) -> Tensor:
        """The m eigenvalues of BA ``[..., m]`` (complex): AB's nonzero eigenvalues, and zeros."""
        return torch.linalg.eigvals(self.BA)

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.mdim})"


# ---------------------------------------------------------------------------- weights, per model kind
class HeadWeights(NamedTuple):
    """Every head's weights, listed per query head: ``W_Q, W_K, W_V [N, H, D, d]``, ``W_O [N, H, d, D]``;
    ``W_E [V, D]``; ``W_pos [P, D]`` or None (no position table); ``W_U [D, V]``, ``b_U [V]`` or None (no
    unembedding); ``final_norm``: the module the last residual goes through before W_U (None: none)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    W_E: Tensor
    W_pos: Tensor | None
    W_U: Tensor | None
    b_U: Tensor | None
    final_norm: nn.Module | None
    n_kv_heads: int


def _stack_heads(blocks, fold: bool) -> tuple[Tensor, ...]:
    """W_Q, W_K, W_V [N, H, D, d] and W_O [N, H, d, D] from each block's ``attn.head_projections``."""
    per_layer = []
    for block in blocks:
        attn = block.attn
        heads = [attn.head_projections(i) for i in range(attn.n_heads)]
        W_Q, W_K, W_V, W_O = (torch.stack([getattr(p, n) for p in heads]) for n in ("W_Q", "W_K", "W_V", "W_O"))
        if fold:  # x -> norm(x) * w: x @ (diag(w) W) for each of W_Q, W_K, W_V
            w = block.ln_attn.weight[:, None]  # [D, 1]
            W_Q, W_K, W_V = W_Q * w, W_K * w, W_V * w
        per_layer.append((W_Q, W_K, W_V, W_O))
    return tuple(torch.stack(t).detach() for t in zip(*per_layer))


def _transformer_weights(model: nn.Module, fold: bool) -> HeadWeights:
    cfg = model.config
    if cfg.n_targets != 1:
        raise ValueError(f"this model predicts {cfg.n_targets} targets per position; the circuits through the "
                         "unembedding need one (ModelConfig(n_targets=1))")
    embed = model.embed
    table = embed.positions.weight if embed.learned else getattr(embed, "positions_table", None)
    W_E = embed.tokens.weight.detach()  # [V, D]
    if cfg.post_norm:
        # Post-norm (MiniLM: a norm after each sublayer): nothing to fold into W_Q, W_K, W_V, and the model's
        # output is its last residual, with no unembedding trained (the checkpoint has no MLM head).
        return HeadWeights(*_stack_heads(model.blocks, False), W_E, None if table is None else table.detach(),
                           None, None, None, cfg.n_key_value_heads or cfg.n_heads)
    W_U = W_E.T if model.head is None else model.head.weight.detach().T  # [D, V]; tied: W_U = W_Eᵀ
    b_U = None if model.head is None or model.head.bias is None else model.head.bias.detach()
    if fold:
        W_U = W_U * model.ln_final.weight.detach()[:, None]  # [D, V] * [D, 1]
    return HeadWeights(*_stack_heads(model.blocks, fold), W_E, None if table is None else table.detach(), W_U, b_U,
                       model.ln_final, cfg.n_key_value_heads or cfg.n_heads)


def head_weights(model: nn.Module, *, fold_ln: bool = True) -> HeadWeights:
    """The weights every circuit here is read from (see :class:`HeadWeights`), for any mhalab ``Transformer``:
    the toy models, SmolLM2 and MiniLM (each a ``Transformer`` of one ``ModelConfig``)."""
    from .models import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(f"circuits reads a mhalab Transformer (the toy models, SmolLM2, MiniLM), "
                        f"got {type(model).__name__}")
    return _transformer_weights(model, fold_ln)


def _weights(model) -> HeadWeights:
    return model if isinstance(model, HeadWeights) else head_weights(model)


def _head(w: HeadWeights, layer: int, head: int) -> tuple[int, int]:
    N, H = w.W_Q.shape[:2]
    return (check_index("layer", layer, N, valid=f"the model has {N} layers,"),
            check_index("head", head, H, valid=f"each layer has {H} heads,"))


def _unembedding(w: HeadWeights) -> Tensor:
    if w.W_U is None:
        raise ValueError("this model has no unembedding (W_U): it outputs vectors, not next-token logits, so circuits "
                         "through W_U (full OV circuit, direct logit attribution, logit lens) do not exist for it")
    return w.W_U


# ---------------------------------------------------------------------------- circuits
def QK(model) -> FactoredMatrix:
    """Every head's ``W_QK = W_Q W_Kᵀ``: ``[N, H, D, D]`` (TransformerLens's ``model.QK``)."""
    w = _weights(model)
    return FactoredMatrix(w.W_Q, w.W_K.transpose(-2, -1))


def OV(model) -> FactoredMatrix:
    """Every head's ``W_OV = W_V W_O``: ``[N, H, D, D]`` (TransformerLens's ``model.OV``)."""
    w = _weights(model)
    return FactoredMatrix(w.W_V, w.W_O)


def full_qk_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_E W_QK W_Eᵀ [V, V]``: the score a query token gives a key token, from the token embeddings alone."""
    w = _weights(model)
    l, h = _head(w, layer, head)
    return FactoredMatrix(w.W_E @ w.W_Q[l, h], (w.W_E @ w.W_K[l, h]).T)


def positional_qk_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_pos W_QK W_posᵀ [P, P]``: the score query position i gives key position j, from the position table."""
    w = _weights(model)
    l, h = _head(w, layer, head)
    if w.W_pos is None:
        raise ValueError("this model has no position table (rotary or no positions), so no positional QK circuit")
    return FactoredMatrix(w.W_pos @ w.W_Q[l, h], (w.W_pos @ w.W_K[l, h]).T)


def full_ov_circuit(model, layer: int, head: int) -> FactoredMatrix:
    """``W_E W_OV W_U [V, V]``: row t says which logits the head raises when it attends to token t."""
    w = _weights(model)
    l, h = _head(w, layer, head)
    return FactoredMatrix(w.W_E @ w.W_V[l, h], w.W_O[l, h] @ _unembedding(w))


def composition_scores(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """Elhage et al.'s ``||left @ right||_F / (||left||_F ||right||_F)``, over broadcast leading axes.

    ``left = A1 B1``, ``right = A2 B2``: ``||A1 C B2||² = sum((A1ᵀA1) * (C B2B2ᵀ Cᵀ))`` with ``C = B1 A2``, so
    only inner-width matrices are formed."""
    if left.rdim != right.ldim:
        raise ValueError(f"left [{left.ldim} x {left.rdim}] and right [{right.ldim} x {right.rdim}] do not chain")
    C = left.B @ right.A  # [..., m1, m2]
    gram_left, gram_right = left.A.transpose(-2, -1) @ left.A, right.B @ right.B.transpose(-2, -1)
    product = (gram_left * (C @ gram_right @ C.transpose(-2, -1))).sum((-2, -1)).clamp(min=0).sqrt()
    return product / (left.norm() * right.norm())


_MODES = {"Q": lambda qk, ov: qk, "K": lambda qk, ov: qk.T, "V": lambda qk, ov: ov}


def all_composition_scores(model, mode: str) -> Tensor:
    """``[N, H, N, H]``: how much head (l1, h1)'s OV output feeds head (l2, h2)'s queries (``"Q"``), keys
    (``"K"``) or values (``"V"``); 0 unless l1 < l2 (TransformerLens's ``model.all_composition_scores``)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be 'Q', 'K' or 'V' (which input of the later head reads the earlier one's "
                         f"output), got {mode!r}")
    w = _weights(model)
    N, H = w.W_Q.shape[:2]
    ov, right = OV(w), _MODES[mode](QK(w), OV(w))
    scores = torch.zeros(N, H, N, H, dtype=w.W_Q.dtype)
    for l in range(N - 1):  # one source layer at a time: [H, 1, 1] x [1, later layers, H]
        later = right[l + 1:]
        left = FactoredMatrix(ov.A[l][:, None, None], ov.B[l][:, None, None])
        scores[l, :, l + 1:] = composition_scores(left, FactoredMatrix(later.A[None], later.B[None]))
    return scores


def composition_baseline(d_model: int, d_head: int, n: int = 256, *, seed: int = 0) -> Tensor:
    """``[n]`` composition scores of random products of Gaussian matrices of a head's shapes (``[D, d] [d, D]``,
    rank d), the baseline Elhage et al. compare with; their mean square is close to 1 / d_model."""
    check_int("d_head", d_head, 1, maximum=check_int("d_model", d_model, 1))
    g = torch.Generator().manual_seed(seed)
    A1, A2 = (torch.randn(check_int("n", n, 1), d_model, d_head, generator=g, dtype=torch.float64) for _ in "12")
    B1, B2 = (torch.randn(n, d_head, d_model, generator=g, dtype=torch.float64) for _ in "12")
    return composition_scores(FactoredMatrix(A1, B1), FactoredMatrix(A2, B2))


def copying_score(circuit: FactoredMatrix) -> Tensor:
    """``sum(Re λ) / sum(|λ|)`` over the eigenvalues λ of a square circuit ``[...]``: +1 when it maps every
    token to itself with positive weight (copies), -1 when it suppresses (Elhage et al. 2021)."""
    lam = circuit.eigenvalues
    return lam.real.sum(-1) / lam.abs().sum(-1)


# ---------------------------------------------------------------------------- on activations
def _final_residual_and_heads(model, tokens: Tensor) -> tuple[Tensor, Tensor, int]:
    N = len(model.blocks)
    names = [f"blocks.{i}.attn.hook_z" for i in range(N)] + [f"blocks.{N - 1}.hook_resid_post"]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    return cache[names[-1]], torch.stack([cache[n] for n in names[:-1]]), N  # [B, T, D], [N, B, T, H, d]


def head_results(model, tokens: Tensor) -> Tensor:
    """``[N, B, T, H, D]``: what each head writes into the residual stream (``z_h @ W_O^h``, no bias), from
    ``hook_z`` (TransformerLens's ``hook_result``)."""
    w = _weights(model)
    _, z, _ = _final_residual_and_heads(model, tokens)
    return torch.einsum("nbthd,nhdD->nbthD", z, w.W_O.to(z.dtype))


def _norm_scale(norm: nn.Module, x: Tensor) -> Tensor:
    """``[..., 1]``: what ``norm`` divides ``x [..., D]`` by (LayerNorm after centring, RMSNorm without)."""
    if isinstance(norm, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    return (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()


def apply_ln_to_stack(model, stack: Tensor, final_residual: Tensor) -> Tensor:
    """``stack [..., B, T, D]`` of components of ``final_residual [B, T, D]``, each divided by the final norm's
    scale on that residual (LayerNorm: each centred first), as TransformerLens's ``cache.apply_ln_to_stack``; the
    norm's weight is in W_U (``fold_ln``)."""
    norm = _weights(model).final_norm
    if norm is None:
        raise ValueError("this model has no final norm before an unembedding")
    if isinstance(norm, nn.LayerNorm):
        stack = stack - stack.mean(-1, keepdim=True)
    return stack / _norm_scale(norm, final_residual)


def direct_logit_attribution(model, tokens: Tensor, right: Tensor, wrong: Tensor | None = None) -> Tensor:
    """``[N, H, B, T]``: each head's direct effect on the logit of ``right`` minus that of ``wrong`` (ids
    ``[B, T]``, or ints) at every position, through the final norm's scale; without ``wrong``, on the logit
    of ``right`` minus the mean logit."""
    w = _weights(model)
    W_U = _unembedding(w)
    final, z, _ = _final_residual_and_heads(model, tokens)
    results = torch.einsum("nbthd,nhdD->nhbtD", z, w.W_O.to(z.dtype))  # [N, H, B, T, D]
    B, T = tokens.shape
    right = torch.as_tensor(right).expand(B, T)
    direction = W_U.T[right] - (W_U.T[torch.as_tensor(wrong).expand(B, T)] if wrong is not None else W_U.mean(1))
    return (apply_ln_to_stack(w, results, final) * direction).sum(-1)  # [N, H, B, T]


def accumulated_resid(model, tokens: Tensor) -> Tensor:
    """``[N + 1, B, T, D]``: the residual stream entering each block, then after the last one."""
    N = len(model.blocks)
    names = [f"blocks.{i}.hook_resid_pre" for i in range(N)] + [f"blocks.{N - 1}.hook_resid_post"]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    return torch.stack([cache[n] for n in names])


def logit_lens(model, tokens: Tensor) -> Tensor:
    """``[N + 1, B, T, V]``: the residual at every layer (:func:`accumulated_resid`) through the final norm
    and the unembedding, as if the model ended there (nostalgebraist 2020); the last row is the model's logits."""
    w = head_weights(model, fold_ln=False)
    W_U = _unembedding(w)
    with torch.no_grad():
        logits = w.final_norm(accumulated_resid(model, tokens)) @ W_U
    return logits if w.b_U is None else logits + w.b_U
