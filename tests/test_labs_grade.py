"""Tests for grading (``python -m mhalab.labs grade``) on the synthetic notebook of tests/labs_fixture.py:
the solution, the student version, wrong and missing answers, a slow cell, a dead kernel, and the two
forgeries (outcomes written from a cell; the course's reference handed in). Each starts a kernel (slow).
"""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from labs_fixture import synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab.labs.__main__ import main as labs_main
from mhalab.labs.grade import NOT_CHECKED, grade, student_version


def test_command_line_entry_point():
    run = subprocess.run([sys.executable, "-m", "mhalab.labs", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "release" in run.stdout and "grade" in run.stdout


def _grade(tmp_path, nb, name="99_fixture.ipynb", **kwargs):
    path = tmp_path / name
    nbformat.write(nb, path)
    return grade(path, timeout=kwargs.pop("timeout", 120), **kwargs)


@pytest.mark.slow
def test_grade_command_gives_the_solution_full_marks_and_the_student_version_zero(tmp_path, capsys):
    solution, student = tmp_path / "99_fixture.ipynb", tmp_path / "99_student.ipynb"
    nbformat.write(synthetic_notebook(), solution)
    nbformat.write(student_version(synthetic_notebook()), student)
    out_json = tmp_path / "grades.json"
    assert labs_main(["grade", str(solution), str(student), "--json", str(out_json), "--timeout", "120"]) == 0
    full, zero = json.loads(out_json.read_text())
    assert [e["status"] for e in full["exercises"]] == ["passed"] * 3
    assert full["score"] == full["max_score"] == 3 and full["errors"] == []
    assert zero["score"] == 0 and zero["max_score"] == 3 and not zero["kernel_died"]
    assert [e["status"] for e in zero["exercises"]] == ["unanswered"] * 3
    out = capsys.readouterr().out
    assert "3/3" in out and "0/3" in out


@pytest.mark.slow
def test_grading_wrong_and_missing_answers(tmp_path):
    nb = synthetic_notebook(answers={"double": "return x + 2"})
    nb.cells[7].source = nb.cells[7].source.replace("q3.check(mask)", "")  # the learner deleted the check
    report = _grade(tmp_path, nb)
    assert {e.key: e.status for e in report.exercises} == {"99.1": "failed", "99.2": "passed", "99.3": NOT_CHECKED}
    assert report.score == 1 and report.max_score == 3
    assert "double(3)" in report.exercises[0].message


@pytest.mark.slow
def test_grading_survives_a_slow_cell_and_a_dead_kernel(tmp_path):
    slow = synthetic_notebook(extra={5: "import time\ntime.sleep(600)"})
    report = _grade(tmp_path, slow, timeout=30)  # generous: imports are slow on a loaded machine
    assert report.score == 3, report.format()
    assert any("KeyboardInterrupt" in e for e in report.errors)

    dies = synthetic_notebook(extra={5: "import os\nos._exit(1)"})
    report = _grade(tmp_path, dies)
    assert report.kernel_died and report.score == 0
    assert {e.status for e in report.exercises} == {NOT_CHECKED} and "kernel died" in report.format()


FORGE_OUTCOMES = """\
# a learner's cell that claims every exercise passed, in every way the kernel can
from mhalab.labs import core
core.Exercise.verdict = lambda self, *a, **k: ("passed", "correct.")
core.Exercise.check = lambda self, *a, **k: print(f"✓ Exercise {self.key} ({self.title}): correct.")
for ex in labs.load("99"):
    ex.last_status, ex.last_message = "passed", "correct."
    ex.check(None)
"""


@pytest.mark.slow
def test_a_cell_that_writes_passed_outcomes_scores_zero(tmp_path):
    nb = student_version(synthetic_notebook())
    nb.cells.insert(4, nbformat.v4.new_code_cell(FORGE_OUTCOMES))
    report = _grade(tmp_path, nb)
    assert report.score == 0, report.format()


@pytest.mark.slow
def test_handing_in_the_reference_scores_zero(tmp_path):
    nb = synthetic_notebook(answers={"double": "return q1.reference(x)", "n_heads": "n_heads = q2.reference",
                                     "mask": "mask = q3.reference"})
    nb.cells[4].source += "\nq1.check(q1.reference)"
    report = _grade(tmp_path, nb)
    assert report.score == 0, report.format()
    assert all("reference" in e.message for e in report.exercises), report.format()
