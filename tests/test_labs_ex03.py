"""Exercises of notebook 03: references pass, plausible mistakes fail with a message that says what is off."""

import pytest

from mhalab import labs

EXERCISES = labs.load("03")


def test_three_exercises_in_order():
    assert [q.number for q in EXERCISES] == [1, 2, 3]


@pytest.mark.parametrize("q", EXERCISES, ids=lambda q: q.key)
def test_reference_and_solution_pass(q, capsys):
    assert q.check(q.reference)
    namespace = {}
    exec("import torch\n" + q.solution_text, namespace)
    solution = [v for k, v in namespace.items() if callable(v) and not k.startswith("__") and k != "torch"][-1]
    assert q.check(solution)
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize("q", EXERCISES, ids=lambda q: q.key)
def test_wrong_answers_fail_with_a_reason(q, capsys):
    for wrong in q.wrong:
        assert not q.check(wrong)
        out = capsys.readouterr().out
        assert out.startswith("✗") and len(out) > 60


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
