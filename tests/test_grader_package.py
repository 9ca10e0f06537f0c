"""The grader is a distribution of its own (grader/, ``mhalab_grader``): what ``pip install mhalab`` installs,
and what ``q.check`` imports, has no grading code; the grader's own wheel has it all."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GRADING = {"kernel.py", "worker.py", "cells.py", "grade.py", "gradebook.py", "sandbox.py", "__main__.py", "zygote.py",
           "forking.py", "kernel_labs.py"}


def _wheel(project: Path, out: Path) -> list[str]:
    """The file names in the wheel pip builds from ``project`` (a copy, so no build files land in the checkout)."""
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(out), str(project)], capture_output=True, text=True, timeout=600)
    if run.returncode != 0 and "No module named" in run.stderr:
        pytest.skip(f"cannot build a wheel here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


@pytest.mark.slow
def test_the_learners_wheel_has_no_grading_code(tmp_path):
    project = tmp_path / "mhalab"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "mhalab", project / "mhalab", ignore=shutil.ignore_patterns("__pycache__"))
    names = _wheel(project, tmp_path / "wheels")
    labs = {Path(n).name for n in names if n.startswith("mhalab/labs/")}
    assert "core.py" in labs and "judging.py" in labs and "ex01.py" in labs  # the exercises stay
    assert not labs & GRADING, sorted(labs & GRADING)
    assert not [n for n in names if "grader" in n]


@pytest.mark.slow
def test_the_graders_wheel_has_the_grading_code(tmp_path):
    project = tmp_path / "grader"
    shutil.copytree(ROOT / "grader", project, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    names = _wheel(project, tmp_path / "wheels")
    assert {Path(n).name for n in names if n.startswith("mhalab_grader/")} >= GRADING
    assert not [n for n in names if n.startswith("mhalab/")]  # the exercises come from mhalab itself


def test_a_check_imports_no_grading_code():
    code = ("import sys\nimport mhalab.labs as labs\nq1 = labs.load('01')[0]\nq1.check(None)\n"
            "print(sorted(m for m in sys.modules if 'grader' in m and not m.startswith('__editable__') or "
            "m.startswith('mhalab.labs.') and "
            "m.rsplit('.', 1)[1] + '.py' in " + repr(sorted(GRADING)) + "))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_mhalab_never_imports_the_grader():
    for path in sorted((ROOT / "mhalab").rglob("*.py")):
        text = path.read_text()
        assert "import mhalab_grader" not in text and "from mhalab_grader" not in text, path
