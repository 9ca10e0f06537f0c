"""The grade refuses what only fools the learner's kernel (issue 47, point 3). In the learner's own kernel ``q.check``
runs there, beside the learner's code, so that code can fool it: patch ``torch.isclose`` (which the tolerance
policy compares with) or ``torch.linalg.eigvals`` (which 10.2's reference uses) in an earlier cell, replace
``q.checker``, call the course's reference from a thread the check's watch does not see, or exec ``q.solution_text``.
Each trick below prints ✓ in a learner's kernel (run here in a process of its own, as a notebook would) and, handed
in to the grader, scores nothing more than the submission's honest work: the grader judges in its own process, with
its own torch and checkers, and the grading kernel has no references, solutions or checkers to reach."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
from labs_fixture import TESTS, answer_meta, synthetic_notebook
from mhalab_grader.grade import grade

import mhalab.labs as labs
from mhalab.labs.core import grade_id

pytestmark = pytest.mark.slow

# (trick, the answer cell of 99.1, whose own answer is wrong: x + 2 for 2 x)
TRICKS_99 = {
    "torch.isclose patched": "import torch\n_isclose = torch.isclose\n"
                             "torch.isclose = lambda a, b, **kw: torch.ones_like(_isclose(a, b, **kw))\n"
                             "def double(x):\n    return x + 2\nq1.check(double)",
    "q.checker replaced": "q1.checker = lambda answer, check: None\ndef double(x):\n    return x + 2\nq1.check(double)",
    "the reference run in a thread": "import threading\ndef double(x):\n    out = []\n"
                                     "    worker = threading.Thread(target=lambda: out.append(q1.reference(x)))\n"
                                     "    worker.start()\n    worker.join()\n    return out[0]\nq1.check(double)",
    "q.solution_text exec'd": "exec(q1.solution_text)\nq1.check(double)",
}

# Notebook 12: its exercise 1 answered honestly, with torch.linalg.eigvals patched in that cell; exercise 2 answered
# with a constant that the patched eigenvalues make the reference give; exercise 3 answered honestly.
PATCH_EIGVALS = "import torch\ntorch.linalg.eigvals = lambda M: torch.ones(M.shape[-1], dtype=torch.complex128)\n"
CONSTANT_SCORE = "def copying_score(W_E, W_V, W_O, W_U):\n    return 1.0\nq2.check(copying_score)"


def _live(cells: list[str]) -> dict:
    """Run ``cells`` as a learner's notebook would, in a process of its own (the tricks patch torch); the status of
    every exercise checked."""
    script = (f"import sys, json\nsys.path.insert(0, {str(TESTS)!r})\nimport labs_fixture\n"
              "namespace = {}\n"
              f"for cell in {cells!r}:\n    exec(cell, namespace)\n"
              "print(json.dumps({q.key: q.last_status for q in namespace.values() "
              "if type(q).__name__ == 'Exercise' and q.last_status}))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _cells_99(answer: str) -> list[str]:
    nb = synthetic_notebook(answers={"double": "return 2 * x"})
    setup = "import torch\nfrom mhalab import labs\nq1, q2, q3 = labs.load('99')"
    return [setup, answer, nb.cells[5].source, nb.cells[7].source]


@pytest.fixture(scope="module")
def instructor_99(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "99_fixture.ipynb"
    nbformat.write(synthetic_notebook(), path)
    return path


@pytest.mark.parametrize("trick", list(TRICKS_99))
def test_a_trick_that_fools_the_learners_check_scores_nothing_when_graded(trick, instructor_99, tmp_path):
    answer = TRICKS_99[trick]
    live = _live(_cells_99(answer))
    assert live["99.1"] == "passed", live  # the learner's kernel is fooled
    nb = synthetic_notebook()
    nb.cells[4].source = answer
    path = tmp_path / "99_submission.ipynb"
    nbformat.write(nb, path)
    report = grade(path, source=instructor_99, timeout=60)
    scores = {e.key: e.score for e in report.exercises}
    assert scores == {"99.1": 0, "99.2": 1, "99.3": 1}, report.format()  # its honest work: 99.2 and 99.3 only
    assert report.score == 2


def _notebook_12(answers: dict[int, str]) -> nbformat.NotebookNode:
    """An instructor's notebook of notebook 12's three exercises (the solutions), or a submission with ``answers``
    ({number: the whole answer cell}) in place of some."""
    cells = [nbformat.v4.new_code_cell("import math\nimport torch\nfrom mhalab import labs\n\n"
                                       "q1, q2, q3 = labs.load('12')")]
    for ex in labs.load("12"):
        first, *body = ex.solution_text.split("\n")
        source = answers.get(ex.number) or "\n".join([first, "    ### BEGIN SOLUTION", *body, "    ### END SOLUTION",
                                                      f"q{ex.number}.check({ex.template[0]})"])
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["nbgrader"] = answer_meta(grade_id(ex.key))
        cells.append(cell)
    return nbformat.v4.new_notebook(cells=cells)


def _fooled_live_then_graded(honest, tricked, tmp_path):
    """Check that the learner's own kernel passes every exercise of the ``tricked`` notebook (the trick fools the
    live check), then grade it against ``honest`` as the release source; returns the grade's report."""
    live = _live([cell.source for cell in tricked.cells])
    assert live == {"12.1": "passed", "12.2": "passed", "12.3": "passed"}, live  # fooled
    source = tmp_path / "source" / "12_what_heads_compute.ipynb"
    source.parent.mkdir()
    nbformat.write(honest, source)
    path = tmp_path / "12_submission.ipynb"
    nbformat.write(tricked, path)
    return grade(path, source=source, timeout=120)


def test_patching_eigvals_in_an_earlier_cell_fools_the_learners_check_and_scores_nothing_when_graded(tmp_path):
    honest = _notebook_12({})
    tricked = _notebook_12({1: PATCH_EIGVALS + honest.cells[1].source, 2: CONSTANT_SCORE})
    report = _fooled_live_then_graded(honest, tricked, tmp_path)
    assert {e.key: e.score for e in report.exercises} == {"12.1": 1, "12.2": 0, "12.3": 1}, report.format()
    assert report.exercises[1].status == "failed" and "exactly 1" in report.exercises[1].message


# The same tricks on a course exercise whose checker draws its cases and names mistakes (12.2): each fools the
# learner's check of a wrong answer (a constant score), and the grade gives 12.2 nothing and the honest 12.1 and 12.3
# their points.
SCORE = "def copying_score(W_E, W_V, W_O, W_U):\n"
TRICKS_12 = {
    "torch.isclose patched": "import torch\n_isclose = torch.isclose\n"
                             "torch.isclose = lambda a, b, **kw: torch.ones_like(_isclose(a, b, **kw))\n"
                             + CONSTANT_SCORE,
    "q.checker replaced": "q2.checker = lambda answer, check: None\n" + CONSTANT_SCORE,
    "the reference run in a thread": "import threading\n" + SCORE + "    out = []\n"
                                     "    worker = threading.Thread(target=lambda: out.append(q2.reference(W_E, W_V, "
                                     "W_O, W_U)))\n    worker.start()\n    worker.join()\n    return out[0]\n"
                                     "q2.check(copying_score)",
    "q.solution_text exec'd": "exec(q2.solution_text)\nq2.check(copying_score)",
}


@pytest.mark.parametrize("trick", list(TRICKS_12))
def test_each_trick_on_a_course_exercise_scores_nothing_when_graded(trick, tmp_path):
    honest = _notebook_12({})
    tricked = _notebook_12({2: TRICKS_12[trick]})
    report = _fooled_live_then_graded(honest, tricked, tmp_path)
    assert {e.key: e.score for e in report.exercises} == {"12.1": 1, "12.2": 0, "12.3": 1}, report.format()
    assert report.exercises[1].status != "passed", report.format()
