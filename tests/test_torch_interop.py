"""mhalab.torch_interop: MultiHeadAttention to torch.nn.MultiheadAttention and back, with the same weights; what
torch's module cannot hold is refused by name. (test_attention.py compares the two modules' outputs through it.)"""

import pytest
import torch
from small_models import D, H, pair
from torch import nn

from mhalab.attention import MultiHeadAttention
from mhalab.counting import count_parameters
from mhalab.torch_interop import from_torch, to_torch


def test_round_trip_through_torch():
    theirs, ours = pair()
    back = to_torch(ours)
    assert back.batch_first
    for a, b in ((back.in_proj_weight, theirs.in_proj_weight), (back.in_proj_bias, theirs.in_proj_bias),
                 (back.out_proj.weight, theirs.out_proj.weight), (back.out_proj.bias, theirs.out_proj.bias)):
        assert torch.equal(a, b)
    assert count_parameters(ours) == count_parameters(theirs)
    without_bias = to_torch(MultiHeadAttention(D, H, bias=False))
    assert without_bias.in_proj_bias is None


def test_from_torch_wants_a_torch_module():
    with pytest.raises(TypeError, match="expects a torch.nn.MultiheadAttention"):
        from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="kdim == vdim == embed_dim"):
        from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


def test_torch_cannot_hold_a_grouped_query_module():
    with pytest.raises(ValueError, match="n_key_value_heads == n_heads"):
        to_torch(MultiHeadAttention(D, H, n_key_value_heads=2))
