"""Tests for grading (``python -m mhalab.labs grade``): a synthetic notebook's solution, student
version, wrong answers, a slow cell and a dead kernel; and one real course notebook end to end.
Each test starts a Jupyter kernel (marked slow).
"""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from labs_fixture import lab_notebooks, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab.labs.__main__ import main as labs_main
from mhalab.labs.grade import NOT_CHECKED, grade, printed_outcomes
from mhalab.labs.release import student_version

LAB_NOTEBOOKS = lab_notebooks()
nb_ids = [p.stem for p in LAB_NOTEBOOKS]


def test_printed_outcomes_are_read_from_outputs():
    nb = synthetic_notebook()
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="✗ Exercise 99.1 (double a number): no answer yet: ...\n✓ Exercise 99.1 (double a number): correct.\n")]
    nb.cells[5].outputs = [nbformat.v4.new_output("stream", text="✗ Exercise 99.2 (a head count): your answer raised TypeError: x\n")]
    found = printed_outcomes(nb)
    assert found["99.1"]["status"] == "passed" and found["99.2"]["status"] == "error"


def test_command_line_entry_point():
    run = subprocess.run([sys.executable, "-m", "mhalab.labs", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "release" in run.stdout and "grade" in run.stdout


# --------------------------------------------------------------------------- grading (runs kernels)


def _grade(tmp_path, nb, name="99_fixture.ipynb", **kwargs):
    path = tmp_path / name
    nbformat.write(nb, path)
    return grade(path, timeout=kwargs.pop("timeout", 120), **kwargs)


@pytest.mark.slow
def test_grade_command_gives_the_solution_full_marks_and_the_student_version_zero(tmp_path, capsys):
    solution = tmp_path / "99_fixture.ipynb"
    nbformat.write(synthetic_notebook(), solution)
    student = tmp_path / "99_student.ipynb"
    nbformat.write(student_version(synthetic_notebook())[0], student)
    out_json = tmp_path / "grades.json"
    assert labs_main(["grade", str(solution), str(student), "--json", str(out_json), "--timeout", "120"]) == 0
    full, zero = json.loads(out_json.read_text())

    assert [e["status"] for e in full["exercises"]] == ["passed"] * 3
    assert full["score"] == full["max_score"] == 3 and full["errors"] == [] and full["outcomes_from"] == "kernel"

    assert zero["score"] == 0 and zero["max_score"] == 3 and not zero["kernel_died"]
    assert [e["status"] for e in zero["exercises"]] == ["unanswered"] * 3
    assert {e["ename"] for e in zero["errors"]} == {"NotImplementedError"}
    out = capsys.readouterr().out
    assert "3/3" in out and "0/3" in out


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

