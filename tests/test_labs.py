"""Tests for mhalab.labs' exercises and the tolerance policy of their checks.

Every exercise (discovered when the tests are collected, every ``mhalab/labs/exNN.py``) must have
entries in tests/labs_corpus.py: alternative right answers that pass, and wrong answers that fail with
the message the corpus names. The course's own reference passes when trusted and scores 0 when handed in.
Judged through a grading kernel, every answer gets the same verdict as in the learner's: test_labs_grade.py.
Student release and grading with kernels: test_labs_release.py and test_labs_grade.py.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading

import labs_fixture  # noqa: F401  (registers notebook "99"'s exercises)
import pytest
import torch
from labs_corpus import CORPUS, MISBLAMED, as_the_corpus_asks, offsets_by_relation_score

import mhalab
import mhalab.labs as labs
from mhalab.labs import core
from mhalab.labs.judging import expect_close, expect_equal, expect_shape, expect_whole

EXERCISES = [ex for nb in labs.available_notebooks() for ex in labs.load(nb)]
IDS = [ex.key for ex in EXERCISES]


@pytest.fixture(autouse=True)
def _not_strict(monkeypatch):
    monkeypatch.delenv(core.STRICT_ENV, raising=False)


# --------------------------------------------------------------------------- every exercise


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_every_exercise_has_a_corpus(ex):
    entry = CORPUS.get(ex.key)
    assert entry, f"exercise {ex.key} has no entries in tests/labs_corpus.py: add right and wrong answers"
    assert len(entry["right"]) >= 2, f"{ex.key}: give at least two alternative right answers"
    assert len(entry["wrong"]) >= 2, f"{ex.key}: give the plausible wrong answers and their messages"


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_reference_passes_and_scores_zero_when_handed_in(ex):
    assert ex.verdict(ex.reference, trusted=True) == (core.PASSED, "correct.")
    if callable(ex.reference) or isinstance(ex.reference, (torch.Tensor, dict, list)):  # (a number is anyone's)
        status, message = ex.verdict(ex.reference)
        assert status == core.FAILED and "reference" in message


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_alternative_right_answers_pass(ex):
    for i, answer in enumerate(CORPUS[ex.key]["right"]):
        verdict = ex.verdict(answer)
        assert as_the_corpus_asks("right", "", *verdict), f"right answer {i} of {ex.key}: {verdict}"


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_wrong_answers_get_the_message_for_their_mistake(ex):
    for i, (answer, expected) in enumerate(CORPUS[ex.key]["wrong"]):
        status, message = ex.verdict(answer)
        assert as_the_corpus_asks("wrong", expected, status, message), \
            f"wrong answer {i} of {ex.key}: {status}; expected {expected!r} in {message!r}"


@pytest.mark.parametrize("key", sorted(MISBLAMED))
def test_no_wrong_answer_is_told_a_mistake_it_did_not_make(key):
    """The messages issue 47 found blaming the wrong thing: each such answer is a wrong answer of the corpus (so its
    own mistake is named, above) and its message does not say the other."""
    ex = labs.exercise(*key.split("."))
    wrong = [answer for answer, _ in CORPUS[key]["wrong"]]
    for answer, unsaid in MISBLAMED[key]:
        assert any(answer is a for a in wrong), f"{key}: {answer} is not among the corpus's wrong answers"
        status, message = ex.verdict(answer)
        assert status in (core.FAILED, core.ERROR) and unsaid not in message, (unsaid, message)


@pytest.mark.parametrize("ex", EXERCISES, ids=IDS)
def test_hint_and_solution_print(ex, capsys):
    ex.hint()
    assert f"exercise {ex.key}" in capsys.readouterr().out
    ex.solution()
    assert ex.solution_text in capsys.readouterr().out


@pytest.mark.parametrize("ex", [ex for ex in EXERCISES if ex.template], ids=lambda ex: ex.key)
def test_printed_solution_passes(ex):
    """What ``solution()`` shows is itself a right answer, and its def line is the template."""
    namespace: dict = {}
    exec("import math\nimport torch\n" + ex.solution_text, namespace)
    assert ex.verdict(namespace[ex.template[0]]) == (core.PASSED, "correct.")


def test_registry_is_consistent():
    for nb in labs.available_notebooks():
        numbers = [ex.number for ex in labs.load(nb)]
        assert numbers == list(range(1, len(numbers) + 1)), f"notebook {nb}'s exercises are numbered {numbers}"


def test_references_match_the_library():
    q1 = labs.exercise("01", 1)
    Q, K, V = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    assert torch.allclose(q1.reference(Q, K, V), mhalab.scaled_dot_product_attention(Q, K, V)[0], atol=1e-6)
    h, T, dk = 3, 5, 4  # 02.1: what a view straight to [B, h, T, d_k] puts in each slot, read off numbered memory
    bug = torch.arange(T * h * dk).view(1, T, h * dk).view(1, h, T, dk)
    for head in range(h):
        for pos in range(T):
            held = [tuple(pair) for pair in labs.exercise("02", 1).reference(h, T, dk, head, pos)]
            assert held == [divmod(int(v), h * dk) for v in bug[0, head, pos]]


def test_cases_tell_the_mistakes_apart():
    """A mistake's message is chosen by the number it gives: in every case those numbers differ."""
    from mhalab.labs import ex04

    name, seq_len, memory, nbytes = ex04._BATCH_CASES[0]  # 04.2: a systematic mistake is named at the first case
    config = ex04._CONFIGS[name]
    values = [v for v, _ in ex04._batch_mistakes(config, seq_len, memory, nbytes)]
    batch = labs.exercise("04", 2).reference(config, seq_len, memory, nbytes)  # the solution's own answer
    assert len(set(values)) == len(values) and batch not in values
    for case in ex04._gqa_cases(core.Check())[
        :1
    ]:  # 04.3: the first case tells every mistake apart (later ones have groups of one)
        outputs = [ex04._gqa_forward(*case)] + [ex04._gqa_forward(*case, **{flag: False})
                                                for flag in ("causal", "interleave", "scale", "merge", "out")]
        for i, a in enumerate(outputs):
            for b in outputs[i + 1:]:
                assert a.shape != b.shape or not torch.allclose(a, b, rtol=1e-3, atol=1e-4), case[-2:]


# --------------------------------------------------------------------------- the learner's view


def test_check_prints_and_returns_nothing(capsys):
    q1 = labs.exercise("99", 1)
    assert q1.check(lambda x: 2 * x) is None
    assert capsys.readouterr().out.startswith("✓ Exercise 99.1")
    assert q1.check(lambda x: x + 2) is None and q1.last_status == core.FAILED


def test_missing_and_crashing_answers():
    q1, q2, _ = labs.load("99")
    assert q2.verdict(None)[0] == core.UNANSWERED

    def placeholder(x):
        raise NotImplementedError("Exercise 99.1: write your answer here")

    assert q1.verdict(placeholder)[0] == core.UNANSWERED

    def crashes(x):
        return x.nonexistent

    status, message = q1.verdict(crashes)
    assert status == core.ERROR and message.startswith("double(3) raised AttributeError") and "of crashes" in message


def test_calling_the_reference_scores_zero_but_every_other_helper_is_fair():
    q1 = labs.exercise("01", 1)
    status, message = q1.verdict(lambda Q, K, V: q1.reference(Q, K, V))
    assert (
        status == core.FAILED
        and "course's own reference or checker (`mhalab.labs.ex01_solution_1.attention`)" in message
    )
    # the course's library and torch are fair wherever the prompt forbids nothing (issue 22's eight refusals)
    assert q1.verdict(lambda Q, K, V: mhalab.scaled_dot_product_attention(Q, K, V)[0]) == (core.PASSED, "correct.")
    # (08.3's answer through mhalab.head_roles.relation_score)
    assert labs.exercise("08", 3).verdict(offsets_by_relation_score) == (core.PASSED, "correct.")


def test_importing_an_mhalab_module_is_not_calling_the_course_code(monkeypatch):
    def double(x):
        import mhalab.diagrams  # noqa: F401  (its first import runs the module's body)

        return 2 * x

    monkeypatch.delitem(sys.modules, "mhalab.diagrams", raising=False)
    assert labs.exercise("99", 1).verdict(double) == (core.PASSED, "correct.")

def test_an_exercise_may_permit_running_some_mhalab_code_but_not_the_part_it_asks_for():
    # 07.1: a model's forward pass and model.run_with_hooks may run; mhalab's own ablation hook may not, even when it
    # is only called from inside model.run_with_hooks (the learner's hook calls it).
    from mhalab.head_interventions import ablate_heads

    q1 = labs.exercise("07", 1)

    def mine(model, tokens, layer, head):
        def off(z, hook):
            z = z.clone()
            z[:, :, head] = 0
            return z
        return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", off)])

    def theirs_inside_mine(model, tokens, layer, head):
        return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z",
                                                        lambda z, hook: ablate_heads([head])(z, hook=hook))])

    assert q1.verdict(mine) == (core.PASSED, "correct.")
    status, message = q1.verdict(theirs_inside_mine)
    assert status == core.FAILED and "mhalab.head_interventions.ablate_heads" in message
    assert "asks you not to use" in message

    def switched_off_watch(model, tokens, layer, head):  # issue 22: sys.setprofile(None) switched the watch off
        sys.setprofile(None)
        return theirs_inside_mine(model, tokens, layer, head)

    status, message = q1.verdict(switched_off_watch)
    assert status == core.FAILED and "sys.setprofile" in message


def test_a_forbid_entry_may_name_a_torch_function_or_class():
    # outside mhalab an entry is a public name, watched where it is defined, and reported as written
    from mhalab.labs.invoke import ForbidWatch

    package = os.path.dirname(mhalab.__file__)
    entries = ("torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward")

    def watched(fn):
        watch = ForbidWatch(entries, package)
        sys.setprofile(watch)
        try:
            fn()
        finally:
            sys.setprofile(None)
        return watch.found

    assert watched(lambda: torch.nn.MultiheadAttention(4, 2)) == "torch.nn.MultiheadAttention"
    assert watched(lambda: torch.nn.functional.scaled_dot_product_attention(*torch.ones(3, 1, 2, 4))) is None
    assert watched(lambda: torch.nn.Linear(4, 4)(torch.ones(4))) is None
    assert ForbidWatch(("torch.nn.NoSuchModule",), package).outside == {}  # a name that is not there watches nothing


def test_a_checker_bug_is_not_the_learners_error(caplog):
    def buggy(answer, check):
        check.calls(answer, [(3,)], lambda x: x)
        raise KeyError("oops")  # a bug in the checker, after the learner's answer returned

    ex = core.Exercise("98", 1, "buggy", buggy, hint="h", solution="def f(x):\n    return x")
    with caplog.at_level(logging.ERROR, logger="mhalab.labs"):
        status, message = ex.verdict(lambda x: x)
    assert (
        status == core.BROKEN
        and "f(3), which returned an int (3)" in message
        and "not necessarily in your answer" in message
    )
    assert "KeyError: 'oops'" in caplog.text


def _drawing_exercise(number: int, drawn: list) -> core.Exercise:
    """A test exercise whose checker draws a hidden input, calls the answer on it, then draws another: it records
    (seed, both inputs)."""
    def checker(answer, check):
        before = torch.randn(3, generator=check.generator(1))
        check.calls(answer, [(before,)], lambda x: x)
        after = torch.randn(3, generator=check.generator(2))  # while another check may have started meanwhile
        drawn.append((check.seed, torch.cat([before, after])))

    return core.Exercise("98", number, "draws", checker, hint="h", solution="def f(x):\n    return x")


def test_fresh_inputs_differ_between_grading_runs_but_not_between_checks():
    drawn = []
    ex = _drawing_exercise(2, drawn)

    def draw(seed):
        assert ex.verdict(lambda x: x, seed=seed) == (core.PASSED, "correct.")
        return drawn[-1][1][:3]

    assert torch.equal(draw(None), draw(None)) and not torch.equal(draw(11), draw(12))


def test_checks_running_at_once_in_two_threads_draw_their_own_hidden_inputs():
    """Two checks in flight together (each waits for the other inside the learner's code), with different
    seeds, each draw and judge on the inputs of their own seed: the seed travels with the check, not the thread."""
    alone = {}
    for seed in (11, 12):
        drawn = []
        _drawing_exercise(3, drawn).verdict(lambda x: x, seed=seed)
        alone[seed] = drawn[0][1]
    assert not torch.equal(alone[11], alone[12])
    both_inside = threading.Barrier(2, timeout=60)
    drawn, got, verdicts = [], {}, {}
    ex = _drawing_exercise(3, drawn)

    def run(seed):
        def answer(x):
            got[seed] = x.clone()
            both_inside.wait()  # the other check is in flight now: it has drawn its first input too
            return x
        verdicts[seed] = ex.verdict(answer, seed=seed)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert verdicts == {11: (core.PASSED, "correct."), 12: (core.PASSED, "correct.")}
    assert sorted(seed for seed, _ in drawn) == [11, 12]
    for seed, x in drawn:
        assert torch.equal(x, alone[seed]) and torch.equal(got[seed], alone[seed][:3]), seed


def test_strict_mode_raises_on_failure(monkeypatch):
    q1 = labs.exercise("99", 1)
    monkeypatch.setenv(core.STRICT_ENV, "1")
    q1.check(lambda x: 2 * x)
    with pytest.raises(AssertionError, match="99.1"):
        q1.check(lambda x: x + 2)


def test_hints_come_one_at_a_time(capsys):
    q2 = labs.exercise(99, 2)
    q2.hint()
    q2.hint()
    out = capsys.readouterr().out
    assert "Hint 1 of 2" in out and "Hint 2 of 2" in out


def test_lookup_errors_are_clear():
    with pytest.raises(ValueError, match="no exercise 9"):
        labs.exercise("99", 9)
    with pytest.raises(ValueError, match="notebook number"):
        labs.load("three")
    with pytest.raises(ValueError, match="no exercises for notebook '97'"):
        labs.load("97")


# --------------------------------------------------------------------------- the tolerance policy


def _wrong(fn, *args, **kwargs) -> str:
    with pytest.raises(core.Wrong) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_numbers_by_value_and_tensors_in_float64():
    np = pytest.importorskip("numpy")
    expect_equal(12.0, 12)
    expect_equal(torch.tensor(12), 12)
    expect_equal(np.int64(12), 12)
    assert expect_whole(32.0) == 32 and "whole number" in _wrong(expect_whole, 12.5)
    x = torch.randn(3, 4)
    expect_close(x.double(), x)
    expect_close(x.numpy(), x)
    expect_close(x.half(), x, rtol=1e-2, atol=1e-2)
    expect_close(x.tolist(), x)
    expect_close([1, 2], (1.0, 2.0))
    expect_equal([4, torch.Size([2, 3])], (4, (2, 3)))
    expect_close({"b": 2.0, "a": 1}, {"a": 1, "b": 2})


def test_messages_say_direction_magnitude_shape_transpose_and_scale():
    message = _wrong(expect_close, 4160, 16640, "the count")
    assert "too small" in message and "10^4" in message and "16640" not in message and "16,640" not in message
    assert "wrong sign" in _wrong(expect_close, -2.0, 3.0)
    # within a factor of 10 the power of ten can be the answer's own (issue 30): say by how much, coarsely
    message = _wrong(expect_close, 9.883, 5.2)
    assert "too large by less than a factor of 2" in message and "of order" not in message and "5.2" not in message
    assert "too small by less than 10%" in _wrong(expect_close, 1.95, 2.0)
    message = _wrong(expect_close, 1.1, 9.5)
    assert "too small by a factor of 2 to 10" in message and "10^" not in message
    assert "single number" in _wrong(expect_close, "13", 12)
    x = torch.randn(2, 4, 4)
    assert "another order" in _wrong(expect_close, torch.zeros(2, 4, 3), torch.zeros(2, 3, 4))
    assert "transposed" in _wrong(expect_close, x.transpose(-1, -2), x)
    assert "constant factor of about 2" in _wrong(expect_close, 2 * x, x)
    assert "NaN" in _wrong(expect_close, torch.full((3,), float("nan")), torch.zeros(3))
    assert "table['b']" in _wrong(expect_close, {"a": 1, "b": 3}, {"a": 1, "b": 2}, "table")
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert "transposed" in _wrong(expect_equal, causal.T, causal, "mask")
    assert "inverted" in _wrong(expect_equal, ~causal, causal, "mask")
    assert "boolean" in _wrong(expect_equal, causal.float(), causal, "mask")
    assert "2 dimensions instead of 3" in _wrong(expect_shape, torch.zeros(2, 7), (2, 7, 1))
    assert re.search(r"expected a function, got an int \(3\)", _wrong(core.Check().calls, 3, [(1,)], lambda x: x))


def test_use_gives_the_learners_answer_once_it_passes_and_the_reference_until_then(capsys):
    """A notebook runs to its end before its exercises are done: the cells after one call q.use(answer)."""
    q = labs.exercise("99", 1)

    def unanswered(x):
        raise NotImplementedError

    def wrong(x):
        return 3 * x

    def right(x):
        return x + x

    for answer, said in ((unanswered, "is not answered yet"), (wrong, "does not pass its check yet")):
        assert q.use(answer) is q.reference  # judged here when it was never checked
        assert said in capsys.readouterr().out
        q.check(answer)
        capsys.readouterr()
        assert q.use(answer) is q.reference  # the last check's verdict, not a second run
        assert said in capsys.readouterr().out
    assert q.use(right) is right and capsys.readouterr().out == ""
    q.check(wrong)
    assert q.use(right) is right  # a different answer than the one last checked is judged anew


def test_labels_say_difficulty_importance_and_minutes():
    for ex in (e for nb in labs.available_notebooks() for e in labs.load(nb)):
        assert ex.label == (f"*Difficulty {'●' * ex.difficulty}{'○' * (5 - ex.difficulty)} · importance "
                            f"{'●' * ex.importance}{'○' * (5 - ex.importance)} · about {ex.minutes} minutes*")
    with pytest.raises(ValueError, match="minutes is a whole number from 1 to 120, got 0"):
        labs.Exercise("99", 9, "t", lambda a, c: None, "h", "x = 1", minutes=0)
    with pytest.raises(ValueError, match="difficulty is a whole number from 1 to 5, got 6"):
        labs.Exercise("99", 9, "t", lambda a, c: None, "h", "x = 1", difficulty=6)
