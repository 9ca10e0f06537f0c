"""Exercises of notebook 04: references and solutions pass, plausible mistakes fail with a reason."""

import torch

from mhalab import labs

EXERCISES = labs.load("04")


def test_three_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2, 3]


def test_specific_messages(capsys):
    q1, q2, q3 = EXERCISES
    q1.check(lambda d, h, t: (d // h, d // h))
    assert "ignores seq_len" in capsys.readouterr().out
    q2.check(lambda q, k: (q[:, None] * k[None, :]).argmax(-1))  # brute force is right
    assert "✓" in capsys.readouterr().out
    q2.check(lambda q, k: k.argmax().expand(len(q)))
    assert "negative" in capsys.readouterr().out
    q3.check(lambda d, r, m: r)
    assert "does not divide" in capsys.readouterr().out
    q3.check(lambda d, r, m: d)
    assert "narrower than min_d_k" in capsys.readouterr().out
