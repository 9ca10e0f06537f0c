"""mhalab.factored_matrix on every head's QK and OV circuits of a small random model, against the full D x D
matrices in float64: products, norms, ranks, singular values and vectors, eigenvalues, scaling."""

import pytest
import torch
from small_models import _direct, _toy

from mhalab import circuits as C


@pytest.mark.parametrize("kv", [None, 2])
def test_qk_ov_and_their_spectra_match_the_full_matrices(kv):
    model = _toy(n_key_value_heads=kv)
    qk, ov = C.QK(model), C.OV(model)
    assert qk.shape == ov.shape == (3, 4, 16, 16)
    assert model.W_K.shape == model.W_V.shape == (3, kv or 4, 16, 4)  # the K/V heads as stored
    assert model.W_Q.shape == (3, 4, 16, 4) and model.W_O.shape == (3, 4, 4, 16)
    assert torch.equal(model.QK.AB, qk.AB) and torch.equal(model.blocks[1].attn.W_Q, model.W_Q[1])
    for l, layer in enumerate(_direct(model)):
        for h, (W_Q, W_K, W_V, W_O) in enumerate(layer):
            for fm, full in ((qk[l, h], W_Q @ W_K.T), (ov[l, h], W_V @ W_O)):
                assert torch.allclose(fm.AB, full, atol=1e-12)
                assert torch.allclose(fm.norm(), full.norm(), atol=1e-12)
                assert torch.allclose(fm.S, torch.linalg.svdvals(full)[:4], atol=1e-10)
                assert int(fm.rank()) == int(torch.linalg.matrix_rank(full)) == 4
                U, S, V = fm.svd()
                assert torch.allclose(U @ torch.diag(S) @ V.T, full, atol=1e-10)
                assert torch.equal(fm.U, U) and torch.equal(fm.V, V)
                assert torch.allclose(fm.U.T @ fm.collapse_r(), torch.diag(S), atol=1e-10)
                assert torch.allclose(fm.U @ fm.collapse_l(), full, atol=1e-10)
                even = fm.make_even()
                assert torch.allclose(even.AB, full, atol=1e-10) and torch.allclose(even.A.norm(), even.B.norm())
                assert torch.allclose((2 * fm).AB, 2 * full) and torch.allclose((fm * torch.tensor(3.0)).AB, 3 * full)
                eig = torch.linalg.eigvals(full)
                top = eig[eig.abs().argsort(descending=True)[:4]]
                mine = fm.eigenvalues
                assert torch.allclose(mine.abs().sort().values, top.abs().sort().values, atol=1e-10)
                assert torch.allclose(mine.real.sum(), eig.real.sum(), atol=1e-10)  # the rest are zeros


def test_rank_sees_a_head_of_lower_rank():
    model = _toy()
    with torch.no_grad():
        model.blocks[1].attn.qkv_proj.weight[2 * 4:2 * 4 + 1] = 0.0  # one of head 2's four query rows
    assert C.QK(model)[1, 2].rank() == 3 and C.OV(model)[1, 2].rank() == 4
