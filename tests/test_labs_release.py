"""Tests for the student release (``python -m mhalab.labs release``) and the nbgrader export.

The rules are unit-tested on a tiny synthetic notebook (tests/labs_fixture.py, exercises of
notebook "99"). Every course notebook with solution regions (found when the tests are collected) is
checked for well-formed markers, and its student version is executed end to end (marked slow).
"""

from __future__ import annotations

import textwrap

import nbformat
import pytest

from labs_fixture import lab_notebooks, synthetic_notebook  # also registers notebook "99"'s exercises
import mhalab.labs as labs
from mhalab.labs.__main__ import main as labs_main
from mhalab.labs.grade import cell_errors, execute, printed_outcomes, read_results, results_cell, score
from mhalab.labs.release import MarkerError, nbgrader_version, plan, replace_regions, solution_regions, student_version

LAB_NOTEBOOKS = lab_notebooks()
nb_ids = [p.stem for p in LAB_NOTEBOOKS]


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
    nbformat.validate(student)


@pytest.mark.slow
@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=nb_ids)
def test_course_notebook_student_release_runs_and_its_solutions_pass(path, tmp_path):
    """One kernel, two parts (one run of the notebook instead of two).

    First the student version: it executes up to and through its exercises, its only errors are the
    NotImplementedError placeholders, and it grades 0 with every exercise "unanswered". Then, in the
    same kernel, the solution notebook's exercise cells run: every check passes, so the solutions pass
    the checks as they are now, not only when the committed outputs were made.
    """
    nb = nbformat.read(path, as_version=4)
    student, p = student_version(nb, path)
    expected = [labs.exercise(*key.split(".")) for key in p.expected]
    solutions = [nbformat.from_dict(nb.cells[c.index]) for c in p.cells if c.cell_type == "code" and (c.regions or c.checks)]
    n = len(student.cells)
    run = nbformat.from_dict(student)
    run.cells += [results_cell(), *solutions, results_cell()]
    run, died = execute(run, cwd=tmp_path, timeout=600)
    assert not died

    student_part = nbformat.from_dict(run)
    student_part.cells = run.cells[:n]
    errors = cell_errors(student_part)
    assert {e.ename for e in errors} <= {"NotImplementedError"}, errors
    grades = score(student_part, expected, read_results(run.cells[n]))
    assert [(g.key, g.status, g.score) for g in grades] == [(ex.key, "unanswered", 0) for ex in expected]

    assert [e for e in cell_errors(run) if e.cell > n] == []
    final = read_results(run.cells[-1])
    assert {key: final.get(key, {}).get("status") for key in p.expected} == {key: "passed" for key in p.expected}

