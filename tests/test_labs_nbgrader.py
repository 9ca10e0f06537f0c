"""nbgrader end to end: in a throwaway venv that adds nbgrader to this environment (it is not a dependency of
the course), ``nbgrader generate_assignment`` and ``autograde`` on a course notebook give every submission the
score ``python -m mhalab_grader grade`` gives it. Installs nbgrader and runs the notebook several times (slow);
it needs PyPI, as the rest of `python3 course.py test` does, and so runs in CI (.ci/run) rather than skipping.
"""

from __future__ import annotations

import copy
import csv
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from labs_fixture import NOTEBOOKS, lab_notebooks, synthetic_notebook
from mhalab_grader.cells import answers, for_nbgrader
from mhalab_grader.grade import grade

from mhalab.labs import load as report_exercises

pytestmark = pytest.mark.slow

NOTEBOOK = NOTEBOOKS / "04_it_costs_nothing.ipynb"  # a quick course notebook (5 s of CPU), its exercises independent


@pytest.fixture(scope="module")
def nbgrader_python(tmp_path_factory) -> Path:
    """The python of a fresh venv that sees this environment's packages (a .pth) and has nbgrader installed."""
    env = tmp_path_factory.mktemp("nbgrader-venv")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # torch, mhalab (editable), Jupyter: seen, not copied
    Path(site, "zz-mhalab-env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "nbgrader"], check=True, timeout=1200)
    return python


def _nbgrader(python: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MHALAB_LABS_STRICT"}  # for_nbgrader's test cells score alone
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"  # nbgrader runs `alembic` from its venv
    run = subprocess.run([str(python), "-m", "nbgrader", *args], cwd=root, env=env, capture_output=True, text=True,
                         timeout=3600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_nbgrader_accepts_the_notebooks_as_they_are(nbgrader_python, tmp_path):
    """nbgrader's validator and ClearSolutions accept every notebook with answer cells, as they are."""
    paths = [str(p) for p in lab_notebooks()]
    fixture = tmp_path / "99_fixture.ipynb"
    nbformat.write(synthetic_notebook(), fixture)
    script = ("import copy, sys, nbformat\nfrom nbgrader.nbgraderformat import MetadataValidator\n"
              "from nbgrader.preprocessors import ClearSolutions\n"
              "for path in sys.argv[1:]:\n    nb = nbformat.read(path, as_version=4)\n"
              "    MetadataValidator().validate_nb(nb)\n"
              "    cleared, _ = ClearSolutions().preprocess(copy.deepcopy(nb), {'language': 'python'})\n"
              "    assert 'BEGIN SOLUTION' not in '\\n'.join(c.source for c in cleared.cells), path\n"
              "print('ok', len(sys.argv) - 1)")
    run = subprocess.run([str(nbgrader_python), "-c", script, str(fixture), *paths], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and f"ok {len(paths) + 1}" in run.stdout, run.stderr[-3000:]


def test_nbgrader_autograde_gives_the_scores_mhalab_gives(nbgrader_python, tmp_path):
    root, name, assignment = tmp_path / "course", NOTEBOOK.name, NOTEBOOK.name[:2]
    (root / "source" / assignment).mkdir(parents=True)
    instructor = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.write(for_nbgrader(instructor), root / "source" / assignment / name)
    (root / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.root = {str(root)!r}\nc.CourseDirectory.course_id = 'mhalab'\n"
        "c.ExecutePreprocessor.timeout = 900\n")
    _nbgrader(nbgrader_python, root, "generate_assignment", assignment, "--force")
    released = nbformat.read(root / "release" / assignment / name, as_version=4)

    found = [a for a in answers(instructor) if not a.written]
    theirs = {a.key: a for a in answers(released) if not a.written}  # the release has a test cell after each answer
    solved = copy.deepcopy(released)
    for a in found:  # each answer cell gets the solution back
        solved.cells[theirs[a.key].index].source = instructor.cells[a.index].source
    first = theirs[found[0].key].index
    wrong = copy.deepcopy(solved)
    wrong.cells[first].source = wrong.cells[first].source.replace(  # the cache counts K only
        "2 * n_kv_heads * d_head", "n_kv_heads * d_head")
    assert wrong.cells[first].source != solved.cells[first].source
    submissions = {"alice": solved, "bob": wrong, "carol": released}
    for student, nb in submissions.items():
        target = root / "submitted" / student / assignment / name
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
        _nbgrader(nbgrader_python, root, "db", "student", "add", student)

    _nbgrader(nbgrader_python, root, "autograde", assignment, "--force")
    _nbgrader(nbgrader_python, root, "export", "--to", str(tmp_path / "grades.csv"))
    with open(tmp_path / "grades.csv") as f:
        theirs = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    ours = {s: grade(root / "submitted" / s / assignment / name, timeout=900).score for s in submissions}
    assert theirs == ours, (theirs, ours)
    points = sum(next(e.points for e in report_exercises(assignment) if e.key == a.key) for a in found)
    assert ours["alice"] == points and ours["bob"] == points - 1 and ours["carol"] == 0, ours
