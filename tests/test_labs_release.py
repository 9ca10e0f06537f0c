"""Tests for the exercise map read from nbgrader's cell metadata and the student release
(``python -m mhalab_grader release``): on the synthetic notebook of tests/labs_fixture.py, and on every
course notebook with answer cells (its student version executed end to end is marked slow).
"""

from __future__ import annotations

import copy

import nbformat
import pytest
from labs_fixture import answer_meta, lab_notebooks, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab_grader.__main__ import main as labs_main
from mhalab_grader.cells import MarkerError, answers, for_nbgrader, solution_regions, student_version
from mhalab_grader.grade import grade

import mhalab.labs as labs
from mhalab.labs.core import grade_id

LAB_NOTEBOOKS = lab_notebooks()
nb_ids = [p.stem for p in LAB_NOTEBOOKS]
SCHEMA_V3_KEYS = {
    "schema_version", "grade", "locked", "solution", "task", "grade_id", "points", "checksum", "cell_type",
}


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


def test_answers_come_from_the_metadata_and_the_check_call():
    found = answers(synthetic_notebook())
    assert [(a.index, a.key, a.written, a.expression) for a in found] == [
        (4, "99.1", False, "double"), (5, "99.2", False, "n_heads"), (6, "99.2", True, None),
        (7, "99.3", False, "mask"),
    ]
    nb = synthetic_notebook()
    nb.cells[7].source += "\nq3.check(mask.T)"  # the cell's last check is what counts
    assert answers(nb)[-1].expression == "mask.T"


@pytest.mark.parametrize("edit, problem", [
    (lambda nb: nb.cells[4].metadata.pop("nbgrader"), "solution region outside an answer cell"),
    (lambda nb: setattr(nb.cells[4], "source", nb.cells[4].source.replace("q1.check(double)", "")), "has none"),
    (lambda nb: nb.cells[4].metadata["nbgrader"].update(grade_id="double"), "should be exNN-K-answer"),
    (lambda nb: nb.cells[5].metadata["nbgrader"].update(grade_id="ex99-1-answer"),
     "exercise 99.1 has two answer cells"),
    (lambda nb: setattr(nb.cells[4], "source", nb.cells[4].source.replace("    ### END SOLUTION\n", "")),
     "without an END"),
])
def test_malformed_answer_cells_are_errors(edit, problem):
    nb = synthetic_notebook()
    edit(nb)
    with pytest.raises(MarkerError, match=problem):
        answers(nb)


def test_student_version_has_placeholders_and_no_solutions():
    nb = synthetic_notebook()
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="twice x is 42\n")]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="✓ Exercise 99.1 (double a number): correct.\n")]
    nb.cells[4].execution_count = 3
    student = student_version(nb)
    text = "\n".join(c.source for c in student.cells)
    for solution_text in ("return 2 * x", "tril()", "divides evenly", "SOLUTION"):
        assert solution_text not in text
    assert student.cells[4].source == ('def double(x):\n    """Twice x."""\n    # YOUR CODE HERE\n'
                                       '    raise NotImplementedError("Exercise 99.1: write your answer here")\n\n'
                                       'q1.check(double)')
    assert student.cells[5].source == "# YOUR CODE HERE: exercise 99.2\nn_heads = None\nq2.check(n_heads)"
    assert student.cells[6].source.endswith("YOUR ANSWER HERE")
    assert all(len(line) <= 80 for line in text.split("\n"))
    assert student.cells[4].outputs == [] and student.cells[4].execution_count is None
    assert student.cells[1].outputs == nb.cells[1].outputs  # everything before the exercises is kept
    assert nb.cells[4].outputs  # the solution notebook itself is untouched
    assert [c.metadata for c in student.cells] == [c.metadata for c in nb.cells]  # nbgrader metadata kept


def test_release_folder_and_check_mode(tmp_path, capsys):
    source = tmp_path / "solutions"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")]), source / "98_plain.ipynb")
    assert labs_main(["release", "--check", str(source)]) == 0
    out = capsys.readouterr().out
    assert "98_plain.ipynb: no exercises, copied unchanged" in out and "answer cells for 99.1, 99.2, 99.3" in out
    assert not (tmp_path / "student").exists()
    assert labs_main(["release", str(source), str(tmp_path / "student")]) == 0
    assert sorted(p.name for p in (tmp_path / "student").iterdir()) == ["98_plain.ipynb", "99_fixture.ipynb"]
    assert "BEGIN SOLUTION" not in (tmp_path / "student" / "99_fixture.ipynb").read_text()
    assert labs_main(["release", str(source), str(source)]) == 1  # never over the solutions
    broken = synthetic_notebook()
    del broken.cells[7].metadata["nbgrader"]
    nbformat.write(broken, source / "99_fixture.ipynb")
    assert labs_main(["release", str(source), str(tmp_path / "again")]) == 1
    assert "cell 7" in capsys.readouterr().err and not (tmp_path / "again").exists()


# --------------------------------------------------------------------------- the course notebooks


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=nb_ids)
def test_course_notebook_answer_cells(path):
    """Every registered exercise has one answer cell (nbgrader schema v3 metadata) ending in its check,
    every answer cell answers a registered exercise, and the student version has no solution left."""
    nb = nbformat.read(path, as_version=4)
    found = [a for a in answers(nb) if not a.written]
    keys = [a.key for a in found]
    assert keys == [ex.key for ex in labs.load(path.name[:2])], f"{path.name}: answer cells {keys}"
    for a in found:
        meta = nb.cells[a.index].metadata["nbgrader"]
        assert set(meta) <= SCHEMA_V3_KEYS and meta == answer_meta(meta["grade_id"]), meta
        assert not a.borrows
    student = student_version(nb)
    assert not any("SOLUTION" in c.source for c in student.cells)
    stubs = [line for a in found for line in student.cells[a.index].source.split("\n")
             if "YOUR CODE" in line or "NotImplementedError" in line]
    assert stubs and all(len(line) <= 80 for line in stubs), stubs
    nbformat.validate(student)


# Two notebooks, one of them reading a real model: every learner copy runs to its end in a plain kernel
# (tests/test_learner_copies.py), and each exercise's grading is tested on its own (tests/test_labs_grade.py).
GRADED_WHOLE = [p for p in LAB_NOTEBOOKS if p.name[:2] in ("02", "08")]


@pytest.mark.slow
@pytest.mark.parametrize("path", GRADED_WHOLE, ids=[p.stem for p in GRADED_WHOLE])
def test_course_notebook_student_version_runs_and_its_solutions_pass(path, tmp_path):
    """Graded as a submission (one grading kernel), the student version with the solution in every other answer
    cell: those exercises pass and the placeholders' are unanswered."""
    nb = nbformat.read(path, as_version=4)
    found = [a for a in answers(nb) if not a.written]
    submission = student_version(nb)
    for a in found[::2]:
        submission.cells[a.index] = copy.deepcopy(nb.cells[a.index])
    target = tmp_path / path.name
    nbformat.write(submission, target)
    report = grade(target, source=path, timeout=600)
    assert not report.kernel_died and not report.missing, report.format()
    for i, a in enumerate(found):
        got = next(e for e in report.exercises if e.key == a.key)
        if i % 2 == 0:
            assert (got.status, got.message) == ("passed", "correct."), report.format()
        else:
            assert got.status == "unanswered", report.format()


def test_for_nbgrader_adds_a_locked_test_cell_worth_the_points_after_each_answer_cell():
    """nbgrader scores only ``grade`` cells, and leaves a ``grade`` + ``solution`` cell to a person: so each
    code answer stays an autograded answer and a locked test cell after it carries the exercise's points."""
    nb = synthetic_notebook()
    out = for_nbgrader(nb)
    assert [c.source for c in nb.cells] == [c.source for c in synthetic_notebook().cells]  # a copy: nb unchanged
    found = [a for a in answers(out) if not a.written]
    assert [a.key for a in found] == ["99.1", "99.2", "99.3"]
    for a in found:
        meta = out.cells[a.index].metadata["nbgrader"]
        assert meta["solution"] and not meta["grade"]
        test = out.cells[a.index + 1]
        q = f"q{a.key[-1]}"
        assert test.metadata["nbgrader"] == {"grade": True, "grade_id": grade_id(a.key, "test"),
                                             "locked": True, "points": 1, "schema_version": 3, "solution": False}
        assert f"assert {q}.last_status == \"passed\"" in test.source
        assert set(test.metadata["nbgrader"]) <= SCHEMA_V3_KEYS
    assert len(out.cells) == len(nb.cells) + 3
    nbformat.validate(out)
