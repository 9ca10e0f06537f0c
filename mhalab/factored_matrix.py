"""A matrix kept as its two factors, ``A @ B`` (TransformerLens's ``FactoredMatrix``, in a module of its own there
too): ranks, norms, singular values and eigenvalues come from m x m matrices (m the inner width, e.g. d_head), so the
full l x r matrix is formed only when asked for (``AB``). :mod:`mhalab.circuits` keeps every circuit as one."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

__all__ = ["FactoredMatrix"]


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
