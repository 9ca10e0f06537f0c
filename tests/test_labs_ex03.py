"""Exercises of notebook 03: messages that name the mistake (every exercise's reference, printed solution and wrong answers are checked in test_labs.py)."""

from mhalab import labs

EXERCISES = labs.load("03")


def test_three_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2, 3]


def test_specific_messages(capsys):
    q1, q2, q3 = EXERCISES
    q1.check(lambda d, h: (d // h, 4 * d * d + 4 * d, 2 * d))
    assert "biases" in capsys.readouterr().out
    q2.check(lambda d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value:
             2 * d_model * n_layers * seq_len * batch_size)
    assert "bytes_per_value" in capsys.readouterr().out
    q3.check(lambda d_model, n_heads, n_kv_heads, n_layers: 2 * d_model * n_layers)
    assert "n_kv_heads" in capsys.readouterr().out


def test_answers_as_tensors_and_bad_types(capsys):
    import torch

    q1, q2, _ = EXERCISES
    assert q1.check(lambda d, h: (torch.tensor(d // h), 4 * d * d, 2 * d))
    assert not q1.check(lambda d, h: "64")
    assert "tuple" in capsys.readouterr().out
    assert not q2.check(lambda **kw: [1])
    assert "should be a number" in capsys.readouterr().out
