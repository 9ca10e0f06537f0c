"""Tests for grading (``python -m mhalab_grader grade``) on the synthetic notebook of tests/labs_fixture.py: the
solution, the student version, wrong and missing answers, a slow cell, a dead kernel, and every attack of
issue 22 (each scores 0 or is flagged). Judged through a grading kernel, every corpus answer gets the verdict
it gets in the learner's kernel. Each test starts grading kernels (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import labs_fixture
import nbformat
import pytest
from labs_corpus import CORPUS
from labs_fixture import TESTS, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab_grader.__main__ import main as labs_main
from mhalab_grader.cells import student_version
from mhalab_grader.grade import MISSING, NOT_CHECKED, grade, similarity
from mhalab_grader.kernel import GradingKernel, _Handed, spec_of

import mhalab.labs as labs
from mhalab.labs import core

pytestmark = pytest.mark.slow


def test_command_line_entry_point():
    run = subprocess.run([sys.executable, "-m", "mhalab_grader", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "release" in run.stdout and "grade" in run.stdout


@pytest.fixture
def instructor(tmp_path):
    """The instructor's copy of notebook 99 (the solution notebook)."""
    path = tmp_path / "source" / "99_fixture.ipynb"
    path.parent.mkdir()
    nbformat.write(synthetic_notebook(), path)
    return path


def _grade(tmp_path, instructor, nb, name="99_submission.ipynb", **kwargs):
    path = tmp_path / name
    nbformat.write(nb, path)
    return grade(path, source=instructor, timeout=kwargs.pop("timeout", 60), **kwargs)


def _student(answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The student version with some answer cells filled in ({"double": source of the whole cell})."""
    nb = student_version(synthetic_notebook())
    for name, text in (answers or {}).items():
        index = {"double": 4, "n_heads": 5, "mask": 7}[name]
        nb.cells[index].source = text
    return nb


def test_grade_command_gives_the_solution_full_marks_and_the_student_version_zero(tmp_path, instructor, capsys):
    solution, student = tmp_path / "99_fixture.ipynb", tmp_path / "99_student.ipynb"
    nbformat.write(synthetic_notebook(), solution)
    nbformat.write(student_version(synthetic_notebook()), student)
    out_json = tmp_path / "grades.json"
    assert labs_main(["grade", str(solution), str(student), "--source", str(instructor.parent), "--json", str(out_json),
                      "--timeout", "60"]) == 0
    full, zero = json.loads(out_json.read_text())
    assert [e["status"] for e in full["exercises"]] == ["passed"] * 3
    assert full["score"] == full["max_score"] == 3 and full["errors"] == [] and full["flags"] == []
    assert zero["score"] == 0 and zero["max_score"] == 3 and not zero["kernel_died"]
    assert [e["status"] for e in zero["exercises"]] == ["unanswered"] * 3
    out = capsys.readouterr().out
    assert "3/3" in out and "0/3" in out


def test_grading_wrong_and_missing_answers(tmp_path, instructor):
    nb = synthetic_notebook(answers={"double": "return x + 2"})
    nb.cells[7].source = nb.cells[7].source.replace("q3.check(mask)", "")  # the learner deleted the check
    report = _grade(tmp_path, instructor, nb)
    assert {e.key: e.status for e in report.exercises} == {"99.1": "failed", "99.2": "passed", "99.3": NOT_CHECKED}
    assert report.score == 1 and report.max_score == 3
    assert "double(3)" in report.exercises[0].message

    del nb.cells[5]  # no answer cell for 99.2 at all: 0 points, and the report says it is missing
    report = _grade(tmp_path, instructor, nb)
    assert (
        report.exercises[1].status == MISSING
        and report.missing == ["99.2"]
        and "No answer cell for 99.2" in report.format()
    )


def test_grading_survives_a_slow_cell_and_a_dead_kernel(tmp_path, instructor):
    slow = _student({"n_heads": "import time\ntime.sleep(600)\nn_heads = 4\nq2.check(n_heads)"})
    slow.cells[4].source = synthetic_notebook().cells[4].source
    report = _grade(tmp_path, instructor, slow, timeout=15)
    assert report.exercises[0].status == "passed" and report.exercises[1].status == NOT_CHECKED, report.format()
    assert any("stopped after 15 s" in e for e in report.errors)

    endless = _student({"double": "def double(x):\n    while True:\n        pass\nq1.check(double)"})
    report = _grade(tmp_path, instructor, endless, timeout=15)  # an endless answer: stopped, and the rest graded
    assert report.exercises[0].status == core.ERROR and "ran past 15 s" in report.exercises[0].message, report.format()

    dies = _student({"double": "import os\nos._exit(1)"})
    report = _grade(tmp_path, instructor, dies)
    assert report.kernel_died and report.score == 0
    assert {e.status for e in report.exercises} == {NOT_CHECKED} and "kernel died" in report.format()
    assert "died in cell 4 (the answer cell of exercise 99.1)" in report.exercises[0].message, report.format()


@pytest.mark.parametrize("how", ["import os\nos._exit(1)", "import ctypes\nctypes.string_at(0)"])  # exits, segfaults
def test_a_kernel_dying_later_keeps_the_exercises_judged_before(tmp_path, instructor, how):
    """The kernel dies in exercise 99.3's cell: 99.1 and 99.2, judged before, keep their points; 99.3 gets 0
    with a message naming the cell it died in."""
    nb = synthetic_notebook()
    nb.cells[7].source = how + "\n" + nb.cells[7].source
    report = _grade(tmp_path, instructor, nb)
    assert report.kernel_died and report.score == 2, report.format()
    assert [e.status for e in report.exercises] == ["passed", "passed", NOT_CHECKED]
    assert "the grading kernel died in cell 7 (the answer cell of exercise 99.3)" in report.exercises[2].message


def test_an_answer_that_kills_the_kernel_when_called_gets_0_and_so_do_those_after_it(tmp_path, instructor):
    nb = synthetic_notebook()
    nb.cells[4].source = "def double(x):\n    import os\n    os._exit(1)\nq1.check(double)"
    report = _grade(tmp_path, instructor, nb)
    assert report.kernel_died and report.score == 0, report.format()
    assert report.exercises[0].status == core.ERROR and {e.status for e in report.exercises[1:]} == {NOT_CHECKED}
    assert "while the answer of exercise 99.1 was called" in report.exercises[1].message, report.format()


# --------------------------------------------------------------------------- issue 22's attacks


FORGE_OUTCOMES = """\
# a learner's cell that claims every exercise passed, in every way the kernel can
from mhalab.labs import core
core.Exercise.verdict = lambda self, *a, **k: ("passed", "correct.")
for ex in labs.load("99"):
    ex.last_status, ex.last_message = "passed", "correct."
"""


def test_cells_that_forge_outcomes_or_replace_the_recorder_score_zero(tmp_path, instructor):
    nb = student_version(synthetic_notebook())
    nb.cells.insert(4, nbformat.v4.new_code_cell(FORGE_OUTCOMES))  # not an answer cell: it is never run
    assert _grade(tmp_path, instructor, nb).score == 0
    # in an answer cell: replace what q.check does with one that hands in the reference's outputs
    recorder = ("import labs_fixture\nimport mhalab.labs as L\nL.Exercise.check = lambda self, a: None\n"
                "import _mhalab_grading\n_mhalab_grading.ANSWERS['99.1'] = labs_fixture._double\n"
                "_mhalab_grading.ANSWERS['99.3'] = labs_fixture._causal(5)\n")
    report = _grade(tmp_path, instructor, _student({"double": recorder + "q1.check(None)"}))
    assert report.score == 0, report.format()
    assert any("ModuleNotFoundError" in e or "ImportError" in e for e in report.errors)


def test_the_course_code_cannot_be_reached_from_an_answer(tmp_path, instructor):
    """Handing in the reference, importing it (setprofile(None) first), reading the solution text (directly or
    through a helper an earlier, non-answer cell defined) or the exercise module's file: 0 points."""
    nb = synthetic_notebook(answers={"double": "import sys\n    sys.setprofile(None)\n    from mhalab.labs.ex01 import "
                                               "_attention_reference\n    return 2 * x",
                                     "n_heads": "n_heads = q2.reference",
                                     "mask": "exec(peek(q3))"})
    nb.cells[4].source += "\nq1.check(q1.reference)"
    nb.cells.insert(3, nbformat.v4.new_code_cell("def peek(q):\n    return q.solution_text"))  # dropped by the rebuild
    report = _grade(tmp_path, instructor, nb)
    assert report.score == 0, report.format()

    files = ("import os, mhalab.labs as L\nhere = os.path.dirname(L.__file__)\n"
             "text = ''.join(open(os.path.join(here, f)).read() for f in os.listdir(here) if f != '__init__.py')\n"
             "exec(q1.solution_text + text)\nq1.check(double)")
    report = _grade(tmp_path, instructor, _student({"double": files}))
    assert report.exercises[0].score == 0, report.format()


LOOKUP = """\
import json
def double(x):
    table = {json.dumps(k): v for k, v in TABLE}
    return table[json.dumps(x)]
q1.check(double)
"""


def test_a_lookup_table_learned_from_a_failing_run_scores_zero(tmp_path, instructor):
    seen = tmp_path / "seen.jsonl"
    spy = (f"import json\ndef double(x):\n    open({str(seen)!r}, 'a').write(json.dumps(x) + '\\n')\n    return 0\n"
           "q1.check(double)")
    # unsandboxed: in the sandbox the spy could not even write the inputs out (tests/test_grader_sandbox.py)
    first = _grade(tmp_path, instructor, _student({"double": spy}), sandboxed=False)
    assert first.exercises[0].status == core.FAILED
    inputs = [json.loads(line) for line in seen.read_text().splitlines()]
    table = [(x, labs_fixture._double(x)) for x in inputs]  # the reference's outputs on every input seen so far
    again = _grade(tmp_path, instructor, _student({"double": f"TABLE = {table!r}\n" + LOOKUP}))
    assert again.exercises[0].status == core.ERROR and "KeyError" in again.exercises[0].message, again.format()
    assert again.score == 0


def test_the_grade_is_written_after_every_process_the_submission_started_is_gone(tmp_path, instructor):
    out_json = tmp_path / "grade.json"
    forge = f"import time; time.sleep(4); open({json.dumps(str(out_json))}, 'w').write('forged')"
    forger = (f"import subprocess, sys, os\nforge = {forge!r}\n"
              "subprocess.Popen([sys.executable, '-c', forge], start_new_session=True)   # its own session\n"
              "if os.fork() == 0:                                                         # a double fork, setsid\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        subprocess.run([sys.executable, '-c', forge])\n"
              "    os._exit(0)\n"
              "def double(x):\n    return 2 * x\nq1.check(double)")
    path = tmp_path / "99_forger.ipynb"
    nbformat.write(_student({"double": forger}), path)
    assert (
        labs_main(["grade", str(path), "--source", str(instructor.parent), "--json", str(out_json), "--timeout", "60"])
        == 0
    )
    time.sleep(6)
    report = json.loads(out_json.read_text())
    assert report["score"] == 1, report
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).count("forged")]


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_the_assignment_comes_from_the_name_not_the_metadata(tmp_path, instructor):
    nb = synthetic_notebook()
    for cell in nb.cells:  # a notebook 99 whose answer cells carry notebook 01's ids
        meta = cell.metadata.get("nbgrader")
        if meta:
            meta["grade_id"] = meta["grade_id"].replace("ex99", "ex01")
    report = _grade(tmp_path, instructor, nb)
    assert report.notebooks == ["99"] and report.score == 0 and report.missing == ["99.1", "99.2", "99.3"]
    assert any("labelled for notebook 01" in flag for flag in report.flags)
    report = _grade(tmp_path, instructor, synthetic_notebook(), name="submission.ipynb", assignment="99")
    assert report.score == 3
    with pytest.raises(ValueError, match="--assignment"):
        _grade(tmp_path, instructor, synthetic_notebook(), name="submission.ipynb")


def test_copying_the_published_code_is_flagged():
    q1 = labs.exercise("01", 1)
    assert similarity(q1.solution_text + "\n\nq1.check(attention)", q1) > 0.99
    own = (
        "def attention(Q, K, V):\n    w = torch.einsum('...ld,...sd->...ls', Q, K).div(Q.shape[-1] ** "
        "0.5).softmax(-1)\n"
        "    return torch.einsum('...ls,...sd->...ld', w, V)\nq1.check(attention)"
    )
    assert similarity(own, q1) < 0.9


# --------------------------------------------------------------------------- the grading kernel, directly


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    spec = spec_of(ex for nb in labs.available_notebooks() for ex in labs.load(nb))
    k = GradingKernel(spec, cwd=tmp_path_factory.mktemp("kernel"), timeout=120)
    # tests/ is not in the sandbox: the corpus (numpy and torch only) and the two modules it imports, in the order
    # they import each other, are sent over as a cell
    cell = "import sys, types\n"
    for name in ("labs_cells", "labs_learners", "labs_corpus"):
        source = (TESTS / f"{name}.py").read_text()
        cell += (f"{name} = sys.modules[{name!r}] = types.ModuleType({name!r})\n"
                 f"exec(compile({source!r}, '{name}.py', 'exec'), {name}.__dict__)\n")
    assert k.run_cell(cell + "import _mhalab_grading") is None
    yield k
    k.close()


def _hand_in(kernel, key: str, expression: str):
    assert kernel.run_cell(f"_mhalab_grading.ANSWERS[{key!r}] = {expression}") is None
    is_callable, _ = kernel.handed_in()[key]
    return _Handed("answer") if is_callable else kernel.value(key)


@pytest.mark.parametrize("key", sorted(k for k in CORPUS if k[:2] in labs.available_notebooks()))
def test_judged_through_the_grading_kernel_every_answer_gets_the_same_verdict(kernel, key):
    """Every corpus entry through q.check (here) and through the grader (the answer in the grading kernel, what it
    returns sent back as plain data), on the same cases: the same verdict, and the one the corpus asks for (NumPy
    scalars, 0-d tensors and the rest included)."""
    ex = labs.exercise(*key.split("."))
    entries = [("right", i, a, None) for i, a in enumerate(CORPUS[key]["right"])] + \
              [("wrong", i, a, expected) for i, (a, expected) in enumerate(CORPUS[key]["wrong"])]
    for kind, i, answer, expected in entries:
        index = i if kind == "right" else f"{i}][0"
        remote = _hand_in(kernel, key, f"labs_corpus.CORPUS[{key!r}][{kind!r}][{index}]")
        graded, checked = ex.verdict(remote, runner=kernel), ex.verdict(answer)
        assert graded == checked, (kind, i, graded, checked)
        if kind == "right":
            assert graded == (core.PASSED, "correct."), (i, graded)
        else:
            assert graded[0] in (core.FAILED, core.ERROR) and expected in graded[1], (i, expected, graded)


def test_switching_off_the_watch_in_the_grading_kernel_is_flagged(kernel):
    q1 = labs.exercise("07", 1)
    kernel.run_cell("import sys, torch\nfrom mhalab.head_interventions import ablate_heads\n"
                    "def sneaky(model, tokens, layer, head):\n    sys.setprofile(None)\n"
                    "    return model.run_with_hooks(tokens, fwd_hooks=[(f'blocks.{layer}.attn.hook_z', "
                    "ablate_heads([head]))])")
    status, message = q1.verdict(_hand_in(kernel, "07.1", "sneaky"), runner=kernel, seed=7)
    assert status == core.FAILED and "sys.setprofile" in message
