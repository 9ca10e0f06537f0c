"""The GitHub Actions workflow a fork gets (.github/workflows/ci.yml) runs what .ci/run runs, and only that.

It cannot run here, so this reads it: on push and pull request, one job in a Debian container (where
.ci/run's `apt-get install chromium` works), a pip cache, PyTorch's CPU build (for all three runs of
.ci/run: the newest torch, the floor torch, the README's command), `bash .ci/run` as the only
command, and the notebooks' outputs (the folder .ci/run has conftest.py write) uploaded when it fails.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
CI_RUN = ROOT / ".ci" / "run"


@pytest.fixture(scope="module")
def job() -> dict:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert {"push", "pull_request"} <= set(triggers), f"the workflow must run on push and pull_request, not {triggers}"
    assert len(workflow["jobs"]) == 1, "one job, the same as .ci/run"
    return next(iter(workflow["jobs"].values()))


def _ci_lines() -> list[str]:
    return [line.strip() for line in CI_RUN.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_the_only_command_is_ci_run(job):
    commands = [step["run"].strip() for step in job["steps"] if "run" in step]
    assert commands == ["bash .ci/run"], (
        f"the workflow runs {commands}: put installs and tests in .ci/run, which the workflow calls, "
        "so they cannot drift"
    )
    assert _ci_lines()[-1] == "python3 course.py test"  # and .ci/run ends with the README's test command


def test_debian_as_root_for_chromium(job):
    image = job.get("container")
    image = image["image"] if isinstance(image, dict) else image
    assert image and re.match(r"^python:3\.\d+-(bookworm|trixie)$", image), (
        f"the job must run in a Debian python image (root, with Debian's chromium package), got {image!r}"
    )
    assert any("apt-get install" in line and "chromium" in line for line in _ci_lines())
    assert "export MHALAB_REQUIRE_BROWSER=1 MHALAB_REQUIRE_SANDBOX=1" in _ci_lines()


def test_the_grading_sandbox_can_be_made(job):
    """bubblewrap installed, and the container allowed the namespaces the sandbox makes."""
    assert any("apt-get install" in line and "bubblewrap" in line for line in _ci_lines())
    options = job["container"]["options"].split()
    assert "seccomp=unconfined" in options and "SYS_ADMIN" in options


def test_cpu_torch(job):
    torch_spec = job["env"]["MHALAB_TORCH"]
    assert "download.pytorch.org/whl/cpu" in torch_spec and shlex.split(torch_spec)[0] == "torch"
    assert job["env"]["MHALAB_TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"  # newest and floor runs too
    install = [line for line in _ci_lines() if "pip install" in line]
    assert install == [".venv/bin/python -m pip install -q $MHALAB_TORCH"], install
    assert 'export MHALAB_TORCH="${MHALAB_TORCH:-torch==2.13.0}"' in _ci_lines()


def test_pip_cache(job):
    cache = [step for step in job["steps"] if str(step.get("uses", "")).startswith("actions/cache@")]
    assert len(cache) == 1, "one actions/cache step for pip"
    assert cache[0]["with"]["path"] == job["env"]["PIP_CACHE_DIR"]
    assert "hashFiles('pyproject.toml')" in cache[0]["with"]["key"]
    steps = [step.get("uses", step.get("run")) for step in job["steps"]]
    assert steps.index(cache[0]["uses"]) < steps.index("bash .ci/run"), "restore the cache before installing"


def test_notebook_outputs_uploaded_on_failure(job):
    exported = [line for line in _ci_lines() if line.startswith("export MHALAB_NOTEBOOK_OUTPUTS=")]
    assert exported == ['export MHALAB_NOTEBOOK_OUTPUTS="$PWD/build/notebook-outputs"'], exported
    upload = [step for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and "failure()" in upload[0]["if"]
    assert upload[0]["with"]["path"] == "build/notebook-outputs"


def test_the_unit_tests_also_run_with_the_newest_and_the_floor_torch():
    lines = _ci_lines()
    runs = [n for n, line in enumerate(lines) if line.startswith("python3 tools/floors.py test ")]
    assert [lines[n] for n in runs] == ["python3 tools/floors.py test newest build/env-newest",
                                        "python3 tools/floors.py test floor build/env-floor",
                                        "python3 tools/floors.py test tl build/env-tl"]
    assert runs[-1] < lines.index("python3 course.py test")


def test_ci_budget(job):
    assert job["timeout-minutes"] <= 90  # the project's CI limit; .ci/run itself stays under 35 minutes
