"""Exercises of notebook 01: messages that name the mistake (every exercise's reference, printed solution and wrong answers are checked in test_labs.py)."""

import math

import torch

from mhalab import labs, scaled_dot_product_attention

EXERCISES = labs.load("01")


def test_two_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2]


def test_attention_reference_matches_the_library():
    q1, _ = EXERCISES
    Q, K, V = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    assert torch.allclose(q1.reference(Q, K, V), scaled_dot_product_attention(Q, K, V)[0], atol=1e-6)


def test_specific_messages(capsys):
    q1, q2 = EXERCISES
    q1.check(lambda Q, K, V: (Q @ K.transpose(-2, -1)).softmax(-1) @ V)
    assert "sqrt(d_k)" in capsys.readouterr().out
    q1.check(lambda Q, K, V: (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-1))
    assert "matrix of weights" in capsys.readouterr().out
    q2.check(lambda K, j, w: K[j] * math.log(w * (K.size(0) - 1) / (1 - w)))
    assert "scaling" in capsys.readouterr().out
    q2.check(lambda K, j, w: K[j, :2])
    assert "shape" in capsys.readouterr().out


def test_a_saturated_query_is_not_accepted(capsys):
    # "put a huge score on key j" gives weight ~1, not the asked-for weight: the exercise is about the amount.
    _, q2 = EXERCISES
    assert not q2.check(lambda K, j, w: K[j] * 1000.0)
