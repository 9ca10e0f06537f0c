"""Tests for mhalab.labs: every exercise of every notebook, the check helpers, the student release
and the grader.

Exercises and notebooks are discovered when the tests are collected (``mhalab/labs/exNN.py`` and
``notebooks/NN_*.ipynb``), so a new notebook's exercises are covered without editing this file.
Release and grading logic is unit-tested on a tiny synthetic notebook whose exercises (notebook
"99") live in ``tests/labs_fixture.py``; the real notebooks are released, executed and graded end
to end in tests marked ``slow``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch

import labs_fixture  # noqa: F401  (registers notebook "99"'s exercises)
import mhalab.labs as labs
from mhalab.labs import core
from mhalab.labs.__main__ import main as labs_main
from mhalab.labs.checks import call_on_hidden_cases, case, expect_close, expect_equal, expect_shape, order_of_magnitude
from mhalab.labs.grade import NOT_CHECKED, grade, printed_outcomes
from mhalab.labs.release import (
    MarkerError,
    nbgrader_version,
    plan,
    release,
    replace_regions,
    solution_regions,
    student_version,
)

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"


# --------------------------------------------------------------------------- discovery


def exercise_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(labs.__path__) if re.fullmatch(r"ex\d\d", m.name))


def all_exercises() -> list[core.Exercise]:
    found = []
    for name in exercise_modules():
        importlib.import_module(f"mhalab.labs.{name}")
        found += labs.load(name[2:])
    return found


EXERCISES = all_exercises() + list(labs.load("99"))


def has_solutions(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any("BEGIN SOLUTION" in c.source for c in nb.cells)


COURSE_NOTEBOOKS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
LAB_NOTEBOOKS = [p for p in COURSE_NOTEBOOKS if has_solutions(p)]
nb_ids = [p.stem for p in LAB_NOTEBOOKS]


@pytest.fixture(autouse=True)
def _fresh_outcomes(monkeypatch):
    monkeypatch.delenv(core.STRICT_ENV, raising=False)
    labs.reset()
    yield
    labs.reset()


# --------------------------------------------------------------------------- every exercise


def _mentions(message: str, value) -> bool:
    """Whether a message prints a numeric answer (plainly or with thousands separators)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) < 10:
        return False
    forms = {str(value), f"{value:,}"} if isinstance(value, int) else {f"{value:.4g}", str(value)}
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d.])", message) for f in forms)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_reference_passes(ex, capsys):
    assert ex.check(ex.reference) is True, ex.last_message
    out = capsys.readouterr().out
    assert out.startswith(f"✓ Exercise {ex.key}"), out
    assert labs.results()[ex.key] is True


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_wrong_answers_fail_with_a_useful_message(ex, capsys):
    for i, wrong in enumerate(ex.wrong):
        assert ex.check(wrong) is False, f"wrong answer {i} of exercise {ex.key} passes"
        out = capsys.readouterr().out
        message = ex.last_message
        assert out.startswith(f"✗ Exercise {ex.key}") and message in out
        assert labs.outcomes()[ex.key]["status"] in (core.FAILED, core.ERROR), (i, message)
        assert len(message) >= 20, f"wrong answer {i} of {ex.key}: {message!r} does not say what is off"
        assert not _mentions(message, ex.reference), f"the message for wrong answer {i} of {ex.key} gives the answer away: {message}"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_hint_and_solution_print(ex, capsys):
    ex.hint()
    assert f"exercise {ex.key}" in capsys.readouterr().out
    ex.solution()
    out = capsys.readouterr().out
    assert ex.solution_text in out


def test_registry_is_consistent():
    by_notebook: dict[str, list[int]] = {}
    for ex in EXERCISES:
        by_notebook.setdefault(ex.notebook, []).append(ex.number)
        assert ex.title and ex.points > 0
    for nb_id, numbers in by_notebook.items():
        assert numbers == list(range(1, len(numbers) + 1)), f"notebook {nb_id}'s exercises are numbered {numbers}"
        assert 1 <= len(numbers) <= 4 or nb_id == "99"
    for name in exercise_modules():
        assert labs.load(name[2:]), f"mhalab/labs/{name}.py registers no exercises"


# --------------------------------------------------------------------------- core


def test_check_handles_missing_and_crashing_answers(capsys):
    q1, q2, q3 = labs.load("99")
    assert q2.check(None) is False and labs.outcomes()["99.2"]["status"] == core.UNANSWERED

    def placeholder(x):
        raise NotImplementedError("Your answer here")

    assert q1.check(placeholder) is False and labs.outcomes()["99.1"]["status"] == core.UNANSWERED

    def crashes(x):
        return x.nonexistent

    assert q1.check(crashes) is False
    outcome = labs.outcomes()["99.1"]
    assert outcome["status"] == core.ERROR and "AttributeError" in outcome["message"] and "crashes" in outcome["message"]
    assert labs.results() == {"99.1": False, "99.2": False}
    assert "no answer yet" in capsys.readouterr().out


def test_strict_mode_raises_on_failure(monkeypatch):
    q1 = labs.exercise("99", 1)
    monkeypatch.setenv(core.STRICT_ENV, "1")
    assert q1.check(q1.reference) is True
    with pytest.raises(AssertionError, match="99.1"):
        q1.check(q1.wrong[0])


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
    with pytest.raises(ValueError, match="no exercises for notebook '98'"):
        labs.load("98")


def test_exercise_needs_a_wrong_answer():
    with pytest.raises(ValueError, match="wrong answer"):
        core.Exercise("99", 9, "t", lambda a: None, hint="h", solution="s", reference=1, wrong=[])


# --------------------------------------------------------------------------- checks


def _wrong(fn, *args, **kwargs) -> str:
    with pytest.raises(core.Wrong) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_expect_close_says_direction_and_magnitude_not_the_value():
    message = _wrong(expect_close, 4160, 16640, "the count")
    assert "too small" in message and "10^4" in message and "16640" not in message and "16,640" not in message
    expect_close(1.0 + 1e-6, 1.0)
    expect_close(torch.tensor([1.0]), 1.0)  # a one-element tensor is a scalar answer
    assert "wrong sign" in _wrong(expect_close, -2.0, 3.0)
    assert "single number" in _wrong(expect_close, "12", 12)


def test_expect_close_on_tensors_names_shape_transpose_and_scale():
    x = torch.randn(2, 4, 4)
    assert "[2, 4, 3]" in _wrong(expect_close, torch.zeros(2, 4, 3), torch.zeros(2, 3, 4))
    assert "another order" in _wrong(expect_close, torch.zeros(2, 4, 3), torch.zeros(2, 3, 4))
    assert "transposed" in _wrong(expect_close, x.transpose(-1, -2), x)
    assert "constant factor of about 2" in _wrong(expect_close, 2 * x, x)
    assert "NaN" in _wrong(expect_close, torch.full((3,), float("nan")), torch.zeros(3))
    expect_close(torch.tensor([0.5, float("-inf")]), torch.tensor([0.5, float("-inf")]))
    assert "['b']" in _wrong(expect_close, {"a": 1}, {"a": 1, "b": 2}, "table")
    assert "table['b']" in _wrong(expect_close, {"a": 1, "b": 3}, {"a": 1, "b": 2}, "table")
    assert "[1]" in _wrong(expect_close, (x, x), (x, x.mT.contiguous()))


def test_expect_equal_on_masks_and_counts():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert "transposed" in _wrong(expect_equal, causal.T, causal, "mask")
    assert "inverted" in _wrong(expect_equal, ~causal, causal, "mask")
    assert "boolean" in _wrong(expect_equal, causal.float(), causal, "mask")
    off_by_one = _wrong(expect_equal, torch.ones(4, 4, dtype=torch.bool).tril(-1), causal, "mask")
    assert off_by_one.startswith("4 of 16 entries of mask are wrong")
    expect_equal(12.0, 12)
    assert "whole number" in _wrong(expect_equal, 12.5, 12)
    assert "too large" in _wrong(expect_equal, 1024, 256)


def test_expect_shape_wildcards():
    expect_shape(torch.zeros(2, 7), (2, None))
    assert "2 dimensions instead of 3" in _wrong(expect_shape, torch.zeros(2, 7), (2, 7, 1))
    assert "tensor of shape" in _wrong(expect_shape, 3, (1,))


def test_call_on_hidden_cases_describes_the_case_and_copies_inputs():
    def reference(x, n):
        return x.view(x.shape[0], n, -1)

    def mutates(x, n):
        x.zero_()
        return reference(x, n)

    x = torch.arange(12.0).view(2, 6)
    call_on_hidden_cases(reference, [case(x, 3)], reference)
    message = _wrong(call_on_hidden_cases, mutates, [case(x, 3)], reference)
    assert message.startswith("mutates(tensor[2, 6] float32, 3):") and torch.equal(x, torch.arange(12.0).view(2, 6))
    crash = _wrong(call_on_hidden_cases, lambda x, n: x.view(5, 5), [case(x, 2)], reference, name="split")
    assert "split(tensor[2, 6] float32, 2) raised RuntimeError" in crash
    labelled = _wrong(call_on_hidden_cases, lambda d, h: d, [case(96, 3, label="d_model=96, 3 heads")], lambda d, h: d // h, compare=expect_equal)
    assert "d_model=96, 3 heads" in labelled and "32" not in labelled
    assert order_of_magnitude(0.004) == "of order 10^-3"


# --------------------------------------------------------------------------- release: the text rules


def test_regions_are_replaced_like_nbgrader_keeping_indentation():
    source = textwrap.dedent(
        """\
        def f(x):
            \"\"\"Doc.\"\"\"
            ### BEGIN SOLUTION
            y = x + 1
            return y
            ### END SOLUTION

        ### BEGIN SOLUTION
        z = 3
        ### END SOLUTION
        q1.check(f)"""
    )
    new, n = replace_regions(source, ["# YOUR CODE HERE", "raise NotImplementedError()"])
    assert n == 2
    assert new == textwrap.dedent(
        """\
        def f(x):
            \"\"\"Doc.\"\"\"
            # YOUR CODE HERE
            raise NotImplementedError()

        # YOUR CODE HERE
        raise NotImplementedError()
        q1.check(f)"""
    )


@pytest.mark.parametrize(
    "source, problem",
    [
        ("### BEGIN SOLUTION\nx = 1\n", "without an END"),
        ("x = 1\n### END SOLUTION", "without a BEGIN"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "second BEGIN"),
        ("x = 1  ### BEGIN SOLUTION\n### END SOLUTION", "line of its own"),
        ("## BEGIN SOLUTION: the loop\n## END SOLUTION", "exactly as"),
    ],
)
def test_malformed_markers_are_errors(source, problem):
    with pytest.raises(MarkerError, match=problem):
        solution_regions(source)


# --------------------------------------------------------------------------- the synthetic notebook


def synthetic_notebook(*, answers: dict[str, str] | None = None, extra: dict[int, str] | None = None) -> nbformat.NotebookNode:
    """A small solution notebook with the course's exercise layout (exercises of notebook "99").

    ``answers`` replaces solution bodies ({"double": "return x + 2"}); ``extra`` inserts code cells
    before the given cell index.
    """
    answers = {"double": "return 2 * x", "n_heads": "n_heads = 4", "mask": "mask = torch.ones(5, 5, dtype=torch.bool).tril()", **(answers or {})}
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# Notebook 99: a fixture"),
        v4.new_code_cell("import torch\nx = 21\nprint('twice x is', 2 * x)"),
        v4.new_markdown_cell("## Exercises"),
        v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport labs_fixture\nfrom mhalab import labs\n\nq1, q2, q3 = labs.load(\"99\")"),
        v4.new_code_cell(f"def double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    {answers['double']}\n    ### END SOLUTION\n\nq1.check(double)"),
        v4.new_code_cell(f"### BEGIN SOLUTION\n{answers['n_heads']}\n### END SOLUTION\nq2.check(n_heads)"),
        v4.new_markdown_cell("Why is that a good choice?\n\n### BEGIN SOLUTION\nBecause the width divides evenly.\n### END SOLUTION"),
        v4.new_code_cell(f"mask = None\n### BEGIN SOLUTION\n{answers['mask']}\n### END SOLUTION"),
        v4.new_code_cell("q3.check(mask)"),
    ]
    for index in sorted(extra or {}, reverse=True):
        cells.insert(index, v4.new_code_cell(extra[index]))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_plan_finds_regions_checks_and_the_exercise_section():
    nb = synthetic_notebook()
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="twice x is 42\n")]
    p = plan(nb)
    assert p.problems == [] and p.warnings == []
    assert p.notebooks == ["99"] and p.expected == ["99.1", "99.2", "99.3"]
    assert [c.index for c in p.cells if c.regions] == [4, 5, 6, 7]
    assert [c.answers for c in p.cells if c.regions] == ["99.1", "99.2", None, "99.3"]
    assert p.checked == ["99.1", "99.2", "99.3"]
    assert [c.index for c in p.cells if c.clear] == [4, 5, 7, 8]


def test_student_version_has_placeholders_and_no_solutions():
    nb = synthetic_notebook()
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="twice x is 42\n")]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="✓ Exercise 99.1 (double a number): correct.\n")]
    nb.cells[4].execution_count = 3
    student, _ = student_version(nb)
    text = "\n".join(c.source for c in student.cells)
    assert "return 2 * x" not in text and "n_heads = 4" not in text and "tril()" not in text and "divides evenly" not in text
    assert "BEGIN SOLUTION" not in text
    double = student.cells[4].source
    assert '    # YOUR CODE HERE\n    raise NotImplementedError("Your answer here: exercise 99.1 (double a number).' in double
    assert "q1.hint() gives a hint" in double and double.endswith("q1.check(double)")
    assert student.cells[6].source.endswith("YOUR ANSWER HERE")
    assert student.cells[4].outputs == [] and student.cells[4].execution_count is None
    assert student.cells[1].outputs == nb.cells[1].outputs  # everything before the exercises is kept
    assert nb.cells[4].outputs  # the solution notebook itself is untouched


def test_release_folder_and_check_mode(tmp_path, capsys):
    source = tmp_path / "solutions"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    plain = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nbformat.write(plain, source / "98_plain.ipynb")

    assert labs_main(["release", "--check", str(source)]) == 0
    out = capsys.readouterr().out
    assert "98_plain.ipynb: no exercises, copied unchanged" in out and "4 solution region(s)" in out
    assert not (tmp_path / "student").exists()

    assert labs_main(["release", str(source), str(tmp_path / "student")]) == 0
    written = sorted(p.name for p in (tmp_path / "student").iterdir())
    assert written == ["98_plain.ipynb", "99_fixture.ipynb"]
    assert "BEGIN SOLUTION" not in (tmp_path / "student" / "99_fixture.ipynb").read_text()

    assert labs_main(["release", str(source), str(source)]) == 1  # never over the solutions
    broken = synthetic_notebook()
    broken.cells[4].source = broken.cells[4].source.replace("    ### END SOLUTION\n", "")
    nbformat.write(broken, source / "99_fixture.ipynb")
    assert labs_main(["release", str(source), str(tmp_path / "again")]) == 1
    assert "cell 4" in capsys.readouterr().err and not (tmp_path / "again").exists()


def test_release_warns_about_unchecked_exercises():
    nb = synthetic_notebook()
    del nb.cells[8]  # nobody checks q3 any more
    warnings = plan(nb).warnings
    assert any("99.3 is registered but no cell checks it" in w for w in warnings)
    assert any("cell 7: a solution region with no exercise check after it" in w for w in warnings)


def test_printed_outcomes_are_read_from_outputs():
    nb = synthetic_notebook()
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="✗ Exercise 99.1 (double a number): no answer yet: ...\n✓ Exercise 99.1 (double a number): correct.\n")]
    nb.cells[5].outputs = [nbformat.v4.new_output("stream", text="✗ Exercise 99.2 (a head count): your answer raised TypeError: x\n")]
    found = printed_outcomes(nb)
    assert found["99.1"]["status"] == "passed" and found["99.2"]["status"] == "error"


def test_command_line_entry_point():
    run = subprocess.run([sys.executable, "-m", "mhalab.labs", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "release" in run.stdout and "grade" in run.stdout


def test_nbgrader_version_marks_answers_and_splits_checks_into_locked_tests():
    nb = synthetic_notebook()
    graded = nbgrader_version(nb)
    meta = [(c.source.split("\n")[0], c.metadata.get("nbgrader")) for c in graded.cells]
    answers = [m for _, m in meta if m and m["solution"]]
    tests = [(src, m) for src, m in meta if m and m["grade"] and not m["solution"]]
    assert [m["grade_id"] for m in answers] == ["ex99-1-answer", "ex99-2-answer", "cell6-written", "ex99-3-answer"]
    assert [(src, m["grade_id"], m["points"], m["locked"]) for src, m in tests] == [
        ("assert q1.check(double)", "ex99-1-check", 1, True),
        ("assert q2.check(n_heads)", "ex99-2-check", 1, True),
        ("assert q3.check(mask)", "ex99-3-check", 1, True),
    ]
    assert len(graded.cells) == len(nb.cells) + 2  # two answer cells had their check split off
    assert graded.cells[4].source.endswith("### END SOLUTION") and "return 2 * x" in graded.cells[4].source
    assert len({m["grade_id"] for _, m in meta if m}) == len([m for _, m in meta if m])  # ids are unique


def test_nbgrader_clears_the_nbgrader_version():
    """With nbgrader installed (it is not a dependency), its own ClearSolutions accepts our cells."""
    preprocessors = pytest.importorskip("nbgrader.preprocessors")
    graded = nbgrader_version(synthetic_notebook())
    cleared, _ = preprocessors.ClearSolutions().preprocess(graded, {"language": "python"})
    text = "\n".join(c.source for c in cleared.cells)
    assert "return 2 * x" not in text and "raise NotImplementedError()" in text


# --------------------------------------------------------------------------- grading (runs kernels)


def _grade(tmp_path, nb, name="99_fixture.ipynb", **kwargs):
    path = tmp_path / name
    nbformat.write(nb, path)
    return grade(path, timeout=kwargs.pop("timeout", 120), **kwargs)


@pytest.mark.slow
def test_grading_the_solution_gives_full_marks(tmp_path):
    report = _grade(tmp_path, synthetic_notebook())
    assert [e.status for e in report.exercises] == ["passed"] * 3
    assert report.score == report.max_score == 3 and report.errors == [] and report.outcomes_from == "kernel"


@pytest.mark.slow
def test_grading_the_student_version_gives_zero_without_crashing(tmp_path, capsys):
    student, _ = student_version(synthetic_notebook())
    path = tmp_path / "99_student.ipynb"
    nbformat.write(student, path)
    assert labs_main(["grade", str(path), "--json", str(tmp_path / "grade.json"), "--timeout", "120"]) == 0
    data = json.loads((tmp_path / "grade.json").read_text())
    assert data["score"] == 0 and data["max_score"] == 3
    assert [e["status"] for e in data["exercises"]] == ["unanswered"] * 3
    assert {e["ename"] for e in data["errors"]} == {"NotImplementedError"}
    out = capsys.readouterr().out
    assert "total" in out and "0/3" in out


@pytest.mark.slow
def test_grading_wrong_and_unchecked_answers(tmp_path):
    nb = synthetic_notebook(answers={"double": "return x + 2"})
    del nb.cells[8]  # q3 is never checked
    report = _grade(tmp_path, nb)
    statuses = {e.key: e.status for e in report.exercises}
    assert statuses == {"99.1": "failed", "99.2": "passed", "99.3": NOT_CHECKED}
    assert report.score == 1 and report.max_score == 3
    assert "double(3)" in report.exercises[0].message


@pytest.mark.slow
def test_grading_survives_a_slow_cell_and_a_dead_kernel(tmp_path):
    slow = synthetic_notebook(extra={5: "import time\ntime.sleep(600)"})
    report = _grade(tmp_path, slow, timeout=30)  # generous: imports are slow on a loaded machine
    assert report.score == 3, report.format()
    assert any(e.ename == "KeyboardInterrupt" for e in report.errors)

    dies = synthetic_notebook(extra={5: "import os\nos._exit(1)"})
    report = _grade(tmp_path, dies)
    assert report.kernel_died and report.outcomes_from == "outputs"
    assert {e.key: e.status for e in report.exercises} == {"99.1": "passed", "99.2": NOT_CHECKED, "99.3": NOT_CHECKED}
    assert "kernel died" in report.format()


# --------------------------------------------------------------------------- the real notebooks


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=nb_ids)
def test_course_notebook_release_plan(path):
    """Markers are well formed, every region answers a known exercise, every exercise is checked,
    and the committed solution outputs show every check passing."""
    nb = nbformat.read(path, as_version=4)
    p = plan(nb, path)
    assert p.problems == [] and p.warnings == []
    assert p.expected, f"{path.name} has solution regions but no registered exercises"
    assert all(c.answers for c in p.cells if c.regions and c.cell_type == "code")
    passed = printed_outcomes(nb)
    assert {key: passed.get(key, {}).get("status") for key in p.expected} == {key: "passed" for key in p.expected}
    student, _ = student_version(nb, path)
    assert not any("BEGIN SOLUTION" in c.source for c in student.cells)


@pytest.mark.slow
@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=nb_ids)
def test_course_notebook_student_release_runs_and_grades_zero(path, tmp_path):
    """The student version executes up to and through its exercises; its only errors are the
    NotImplementedError placeholders, and grading it gives 0 on every (unanswered) exercise."""
    release(path, tmp_path, log=None)
    report = grade(tmp_path / path.name, timeout=600)
    assert {e.ename for e in report.errors} <= {"NotImplementedError"}, report.format()
    assert not report.kernel_died
    assert [e.status for e in report.exercises] == ["unanswered"] * len(report.exercises), report.format()
    assert report.score == 0


@pytest.mark.slow
@pytest.mark.parametrize("path", LAB_NOTEBOOKS[:1], ids=nb_ids[:1])
def test_grading_a_course_solution_notebook_gives_full_marks(path, tmp_path):
    """End to end on one real notebook (the others' solutions are executed by nbval, and their committed
    outputs must show every check passing: test_course_notebook_release_plan)."""
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    report = grade(copy, timeout=600)
    assert report.score == report.max_score > 0, report.format()
    assert report.errors == [] and report.outcomes_from == "kernel"
