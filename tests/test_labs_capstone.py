"""The capstone (exercise 02.4): a learner's whole multi-head attention, checked in stages. Each broken
implementation below fails at its own stage and at no earlier one."""

from __future__ import annotations

import pytest
import torch

from mhalab import labs
from mhalab.labs import core
from mhalab.labs.ex02 import _mha, _torch_mha, _weights

CAPSTONE = labs.exercise("02", 4)


def make(*, split="right", merge="right", scale="d_k", mask="causal", project_out=True, half=False, shape="ok"):
    """A multi-head attention with one chosen mistake."""
    def mha(x, W_Q, W_K, W_V, W_O, n_heads):
        if half:
            x, W_Q, W_K, W_V, W_O = (t.half() for t in (x, W_Q, W_K, W_V, W_O))
        B, T, D = x.shape
        H, dk = n_heads, D // n_heads
        cut = {
            "right": lambda t: t.view(B, T, H, dk).transpose(1, 2),
            "no-transpose": lambda t: t.reshape(B, H, T, dk),
        }[split]
        q, k, v = cut(x @ W_Q.T), cut(x @ W_K.T), cut(x @ W_V.T)
        s = q @ k.transpose(-2, -1) / {"d_k": dk ** 0.5, "none": 1.0, "d_model": D ** 0.5}[scale]
        allowed = {"causal": torch.ones(T, T).tril(), "none": torch.ones(T, T), "strict": torch.ones(T, T).tril(-1)}[
            mask
        ].bool()
        z = s.float().masked_fill(~allowed, float("-inf")).softmax(-1).to(v.dtype) @ v
        if shape == "heads":
            return z
        z = {"right": lambda z: z.transpose(1, 2).reshape(B, T, D), "no-transpose": lambda z: z.reshape(B, T, D)}[
            merge
        ](z)
        return (z @ W_O.T if project_out else z).float()
    return mha


BROKEN = {
    1: (make(shape="heads"), "you return the heads"),
    2: (make(project_out=False), "W_O is missing"),
    3: (make(scale="none"), "the scores are not scaled"),
    4: (make(mask="none"), "changed the outputs of earlier tokens"),
    5: (make(split="no-transpose", merge="no-transpose"), "a transpose in the wrong place"),
    6: (make(half=True), "differs from torch's by up to"),
}


def test_the_reference_math_is_torchs():
    x, weights = torch.randn(2, 7, 16), _weights(core.Check(), 16, 1)
    assert torch.allclose(_mha(x, *weights, 4), _torch_mha(x, *weights, 4), atol=1e-10)


def test_a_right_implementation_passes_all_stages():
    assert CAPSTONE.verdict(make()) == (core.PASSED, "correct.")


@pytest.mark.parametrize("stage", sorted(BROKEN))
def test_each_broken_implementation_fails_at_its_stage_and_no_earlier(stage):
    broken, message = BROKEN[stage]
    status, got = CAPSTONE.verdict(broken)
    assert status == core.FAILED and got.startswith(f"stage {stage} of 6"), got
    assert message in got, got


def test_more_named_mistakes():
    assert "merge joins" in CAPSTONE.verdict(make(merge="no-transpose"))[1]
    assert "sqrt(d_model)" in CAPSTONE.verdict(make(scale="d_model"))[1]
    assert CAPSTONE.verdict(make(mask="strict"))[1].startswith("stage 2 of 6 (one head, one token): NaN")
