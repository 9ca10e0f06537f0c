"""What a head reads and writes, from its weights: QK and OV circuits (Elhage et al. 2021), in TransformerLens's terms.

A head's query-key circuit ``W_QK = W_Q W_Kᵀ`` and output-value circuit ``W_OV = W_V W_O`` are D x D matrices of
rank at most d_head. They are kept as :class:`FactoredMatrix` products, so ranks, norms, singular values and
eigenvalues come from d_head x d_head matrices and no D x D (or V x V) matrix is formed. Row-vector convention, as
TransformerLens: a residual ``x [D]`` gives the query ``x @ W_Q``; the attention score of query ``x`` on key ``y`` is
``x @ W_QK @ yᵀ``, and what a head writes for the token it reads is ``y @ W_OV``.

The weights are read as TransformerLens reads them after ``fold_ln`` (:func:`layer_weights`,
:func:`head_weights`): the scale of the norm before each attention layer is folded into its W_Q, W_K, W_V and that
of the final norm into W_U, and, where the norm is a LayerNorm, those reading weights are centred (each column's
mean over the D rows taken out), because a LayerNorm's output has no component along the all-ones direction, so
that component of a reading weight never acts; RMSNorm's output has one, so its weights are not centred. (The
norms' biases go into the biases; TransformerLens's further ``center_writing_weights`` and ``center_unembed`` are
not applied.) These are the functions the models' ``model.QK``, ``model.OV``, ``model.W_Q``, ...,
``model.all_composition_scores`` call. Grouped-query models: ``W_K`` and ``W_V`` hold the G K/V heads as stored
(TransformerLens 4's convention); query head h reads K/V head ``h // (H // G)``, and ``QK``, ``OV`` and the
composition scores repeat them per query head. Shapes: N layers, H query heads, G K/V heads, D d_model, d d_head,
V vocabulary, P positions, B batch, T tokens.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .arguments import validate_index, validate_int

__all__ = [
    "FactoredMatrix", "LayerWeights", "layer_weights", "HeadWeights", "head_weights", "unembedding_weights", "QK",
    "OV", "full_qk_circuit",
    "positional_qk_circuit", "full_ov_circuit", "composition_scores", "all_composition_scores",
    "composition_baseline", "copying_score", "direct_logit_attribution", "logit_lens",
]


# ---------------------------------------------------------------------------- factored matrices
class FactoredMatrix:
    """The matrix ``A @ B`` kept as its factors: ``A [..., l, m]``, ``B [..., m, r]`` (m the inner width, e.g.
    d_head). ``AB`` forms the product ``[..., l, r]``; everything else works through m x m matrices. The calls are
    TransformerLens's: ``AB``, ``BA``, ``T``, ``@``, ``* scalar``, ``[layer, head]``, ``svd()``, ``U``, ``S``,
    ``V`` (``Vh``, its deprecated name there too), ``norm()``, ``eigenvalues``, ``collapse_l()``,
    ``collapse_r()``, ``make_even()``; ``rank()`` is mhalab's."""

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.dim() < 2 or B.dim() < 2 or A.size(-1) != B.size(-2):
            raise ValueError(f"a FactoredMatrix needs A [..., l, m] and B [..., m, r] with the same m, got "
                             f"A {tuple(A.shape)} and B {tuple(B.shape)}")
        lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self.A, self.B = A.expand(*lead, *A.shape[-2:]), B.expand(*lead, *B.shape[-2:])
        self.ldim, self.mdim, self.rdim = A.size(-2), A.size(-1), B.size(-1)
        self.shape = torch.Size((*lead, self.ldim, self.rdim))
        self._svd: tuple[Tensor, Tensor, Tensor] | None = None  # computed once, when first asked for

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

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        """The matrix times a number (a float, or a tensor of one element): A is scaled, B kept."""
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise ValueError(f"a FactoredMatrix multiplies by a scalar, got a tensor of shape {tuple(scalar.shape)}; "
                             "for a matrix product use @")
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __getitem__(self, index) -> FactoredMatrix:
        """Index the leading axes only (``QK(model)[layer, head]``)."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > self.ndim - 2:
            raise IndexError(f"a FactoredMatrix of shape {tuple(self.shape)} indexes its {self.ndim - 2} leading "
                             f"axes only, got {len(index)} indices")
        return FactoredMatrix(self.A[index], self.B[index])

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(U [..., l, k], S [..., k], V [..., r, k])`` with ``AB = U diag(S) Vᵀ`` (TransformerLens's
        convention: V holds the right singular vectors as columns), k = min(l, m, r), from QR factors of A and
        Bᵀ and an m x m SVD."""
        if self._svd is None:
            if self.mdim > min(self.ldim, self.rdim):  # the factors are no narrower than the product: use it
                U, S, Vt = torch.linalg.svd(self.AB, full_matrices=False)
                self._svd = U, S, Vt.transpose(-2, -1)
            else:
                Qa, Ra = torch.linalg.qr(self.A)  # [.., l, m], [.., m, m]
                Qb, Rb = torch.linalg.qr(self.B.transpose(-2, -1))  # [.., r, m], [.., m, m]
                Um, S, Vmt = torch.linalg.svd(Ra @ Rb.transpose(-2, -1))  # AB = Qa (Ra Rbᵀ) Qbᵀ
                self._svd = Qa @ Um, S, Qb @ Vmt.transpose(-2, -1)
        return self._svd

    @property
    def U(self) -> Tensor:
        """Left singular vectors ``[..., l, k]``, as columns."""
        return self.svd()[0]

    @property
    def S(self) -> Tensor:
        """Singular values ``[..., k]``, largest first."""
        return self.svd()[1]

    @property
    def V(self) -> Tensor:
        """Right singular vectors ``[..., r, k]``, as columns: ``AB = U diag(S) Vᵀ``."""
        return self.svd()[2]

    @property
    def Vh(self) -> Tensor:
        """Deprecated, as in TransformerLens 4 (where it always returned V): use ``V``."""
        warnings.warn("FactoredMatrix.Vh returns V, the right singular vectors as columns (as in TransformerLens, "
                      "which deprecates the name too): use .V", DeprecationWarning, stacklevel=2)
        return self.V

    def collapse_l(self) -> Tensor:
        """``diag(S) Vᵀ [..., k, r]``: the matrix with its left orthogonal factor U taken off."""
        U, S, V = self.svd()
        return S[..., :, None] * V.transpose(-2, -1)

    def collapse_r(self) -> Tensor:
        """``U diag(S) [..., l, k]``: the matrix with its right orthogonal factor Vᵀ taken off."""
        U, S, V = self.svd()
        return U * S[..., None, :]

    def make_even(self) -> FactoredMatrix:
        """The same matrix factored as ``(U sqrt(S)) (sqrt(S) Vᵀ)``: each factor carries half of every singular
        value, with orthogonal columns (rows)."""
        U, S, V = self.svd()
        root = S.sqrt()
        return FactoredMatrix(U * root[..., None, :], root[..., :, None] * V.transpose(-2, -1))

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
class LayerWeights(NamedTuple):
    """One attention layer's per-head matrices: ``W_Q [H, D, d]``, ``W_K, W_V [G, D, d]``, ``W_O [H, d, D]``."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor


def _fold(norm: nn.Module | None, W: Tensor) -> Tensor:
    """``W [..., D, n]`` read through ``norm``: its scale folded in (``diag(w) W``) and, a LayerNorm's, the D rows
    centred (``W - mean over D``), as TransformerLens's ``fold_ln``; no norm (or ``nn.Identity``): ``W``."""
    weight = getattr(norm, "weight", None)
    if weight is None:
        return W
    W = W * weight.detach()[:, None]  # [..., D, n] * [D, 1]
    return W - W.mean(-2, keepdim=True) if isinstance(norm, nn.LayerNorm) else W


def layer_weights(attn: nn.Module, *, fold_ln: bool = True) -> LayerWeights:
    """The per-head matrices of the :class:`~mhalab.attention.MultiHeadAttention` ``attn`` (detached), with the
    norm it reads through folded in (``fold_ln``; see the module's docstring), or as stored."""
    H, G, d, D = attn.n_heads, attn.n_key_value_heads, attn.d_head, attn.d_model
    rows = attn.qkv_proj.weight.detach().view(H + 2 * G, d, D)  # [(H + 2G) d, D] -> a [d, D] block per head
    W_Q, W_K, W_V = rows.transpose(-2, -1).split([H, G, G])  # [n, D, d] each: x @ W is the head's q, k or v
    W_O = attn.out_proj.weight.detach().view(D, H, d).permute(1, 2, 0)  # [D, H d] -> [D, H, d] -> [H, d, D]
    norm = attn.input_norm if fold_ln else None
    return LayerWeights(_fold(norm, W_Q), _fold(norm, W_K), _fold(norm, W_V), W_O)


class HeadWeights(NamedTuple):
    """Every layer's weights: ``W_Q [N, H, D, d]``, ``W_K, W_V [N, G, D, d]`` (the K/V heads as stored),
    ``W_O [N, H, d, D]``; ``W_E [V, D]``; ``W_pos [P, D]`` or None (no position table); ``W_U [D, V]``, ``b_U [V]``
    or None (no unembedding, or no bias); ``n_key_value_heads`` (G)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    W_E: Tensor
    W_pos: Tensor | None
    W_U: Tensor | None
    b_U: Tensor | None
    n_key_value_heads: int


def unembedding_weights(model: nn.Module, *, fold_ln: bool = True) -> tuple[Tensor, Tensor | None]:
    """``W_U [D, V]`` and ``b_U [V]`` (or None) of a pre-norm ``Transformer``, with the final norm folded in
    (``fold_ln``): ``norm(x) @ W_U + b_U`` = ``normalized(x) @ (diag(w) W_U) + (b_norm @ W_U + b_U)``, then W_U
    centred over D for a LayerNorm."""
    if model.config.post_norm:
        raise ValueError(_NO_UNEMBEDDING)
    if model.config.n_targets != 1:
        raise ValueError(f"this model predicts {model.config.n_targets} targets per position (its head is "
                         f"[{model.config.n_targets} x d_vocab, d_model]); the unembedding and the circuits through it "
                         "need one (ModelConfig(n_targets=1))")
    W_E = model.embed.tokens.weight.detach()
    W_U = W_E.T if model.head is None else model.head.weight.detach().T  # [D, V]; tied: W_U = W_Eᵀ
    b_U = None if model.head is None or model.head.bias is None else model.head.bias.detach()
    norm = model.ln_final
    bias = getattr(norm, "bias", None)
    if fold_ln and bias is not None:
        b_U = bias.detach() @ W_U + (0.0 if b_U is None else b_U)  # [D] @ [D, V] -> [V]
    return (_fold(norm, W_U) if fold_ln else W_U), b_U


def _transformer_weights(model: nn.Module, fold: bool) -> HeadWeights:
    cfg = model.config
    embed = model.embed
    table = embed.positions.weight if embed.learned else getattr(embed, "positions_table", None)
    W_E = embed.tokens.weight.detach()  # [V, D]
    layers = [layer_weights(block.attn, fold_ln=fold) for block in model.blocks]
    W_Q, W_K, W_V, W_O = (torch.stack(t) for t in zip(*layers))  # each [N, ...]
    G = cfg.n_key_value_heads or cfg.n_heads
    W_pos = None if table is None else table.detach()
    if cfg.post_norm:
        # Post-norm (MiniLM: a norm after each sublayer): the model's output is its last residual, with no
        # unembedding trained (the checkpoint has no MLM head).
        return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_pos, None, None, G)
    W_U, b_U = unembedding_weights(model, fold_ln=fold)
    return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_pos, W_U, b_U, G)


def _validate_transformer(model: nn.Module) -> None:
    from .models import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(f"circuits reads a mhalab Transformer (the toy models, SmolLM2, MiniLM), "
                        f"got {type(model).__name__}")


def head_weights(model: nn.Module, *, fold_ln: bool = True) -> HeadWeights:
    """The weights every circuit here is read from (see :class:`HeadWeights`), for any mhalab ``Transformer``:
    the toy models, SmolLM2 and MiniLM (each a ``Transformer`` of one ``ModelConfig``); ``fold_ln=False``: as
    stored (no norm folded in, nothing centred)."""
    _validate_transformer(model)
    return _transformer_weights(model, fold_ln)


def _attention_weights(model) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every layer's folded ``W_Q, W_K, W_V, W_O`` from a :class:`HeadWeights` or a model (no W_U formed)."""
    if isinstance(model, HeadWeights):
        return model.W_Q, model.W_K, model.W_V, model.W_O
    _validate_transformer(model)
    return tuple(torch.stack(t) for t in zip(*(layer_weights(block.attn) for block in model.blocks)))


def _weights(model) -> HeadWeights:
    return model if isinstance(model, HeadWeights) else head_weights(model)


def _head(w: HeadWeights, layer: int, head: int) -> tuple[int, int]:
    N, H = w.W_Q.shape[:2]
    return (validate_index("layer", layer, N, valid=f"the model has {N} layers,"),
            validate_index("head", head, H, valid=f"each layer has {H} heads,"))


def _per_query_head(W: Tensor, H: int) -> Tensor:
    """K/V weights ``[N, G, ...]`` listed per query head ``[N, H, ...]``: query head h reads K/V head h // (H // G)."""
    return W.repeat_interleave(H // W.size(1), dim=1)


_NO_UNEMBEDDING = ("this model has no unembedding (W_U): it outputs vectors, not next-token logits, so circuits "
                   "through W_U (full OV circuit, direct logit attribution, logit lens) do not exist for it")


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
