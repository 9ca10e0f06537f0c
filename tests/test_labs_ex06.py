"""Exercises of notebook 06: messages that name the mistake (every exercise's reference, printed solution and wrong answers are checked in test_labs.py)."""

import torch

from mhalab import labs

EXERCISES = labs.load("06")


def test_three_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2, 3]


def test_specific_messages(capsys):
    q1, q2, q3 = EXERCISES
    q1.check(lambda L, S: torch.ones(L, S).tril().bool())  # forgets the cached tokens
    assert "n_keys=7" in capsys.readouterr().out
    q1.check(lambda L, S: ~torch.ones(L, S, dtype=torch.bool).tril(S - L))  # True = forbidden
    assert "inverted" in capsys.readouterr().out
    q2.check(lambda b, h, s, t: {"encoder": ("none", (b, h, s, s)), "decoder": ("causal", (b, h, t, t)),
                                 "cross": ("none", (b, h, s, t))})
    assert "tgt_len, src_len" in capsys.readouterr().out
    q2.check(lambda b, h, s, t: {"encoder": ("none", (b, h, s, s))})
    assert "keys" in capsys.readouterr().out
    q3.check(lambda h, e, d: ((e + d) * h, e + d))
    assert "cross-attention" in capsys.readouterr().out
    q3.check(lambda h, e, d: 3)
    assert "pair" in capsys.readouterr().out
