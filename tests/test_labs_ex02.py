"""Exercises of notebook 02: messages that name the mistake (every exercise's reference, printed solution and wrong answers are checked in test_labs.py)."""

import torch

from mhalab import MultiHeadAttention, labs

EXERCISES = labs.load("02")


def test_three_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2, 3]


def test_split_and_merge_match_the_module():
    q1, q2, _ = EXERCISES
    m = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    assert torch.equal(q1.reference(x, 3), m.split_heads(x))
    assert torch.equal(q2.reference(m.split_heads(x).contiguous()), m.merge_heads(m.split_heads(x).contiguous()))


def test_specific_messages(capsys):
    q1, q2, q3 = EXERCISES
    q1.check(lambda x, h: x.view(x.size(0), h, x.size(1), -1))
    assert "every head must see every token" in capsys.readouterr().out
    q3.check(lambda s: s.masked_fill(~torch.ones(s.size(-1), s.size(-1)).tril().bool(), 0.0).softmax(-1))
    assert "-inf" in capsys.readouterr().out
    q3.check(lambda s: s.masked_fill(~torch.ones(s.size(-1), s.size(-1)).tril(-1).bool(), float("-inf")).softmax(-1))
    assert "diagonal" in capsys.readouterr().out
