"""Submissions that try to break out of the grading sandbox (grader/mhalab_grader/sandbox.py), each among
honest ones in one class run: as the user running the tests (root in CI) and, when that is root, again as an
unprivileged user; each by both paths (a kernel forked per submission from a prepared one, and a fresh one).
Each attack gets at most its honest score (3 when it fails: it then hands in right answers; less where it left
its own kernel unable to go on), no other learner's grade moves, the gradebook is whole and nothing on the
machine changes.

The limits are lowered for the run (--memory-mb 1024 --processes 64 --disk-mb 64) and the test process itself
runs under ``RLIMIT_AS``-free but process-bounded guards: the fork bomb stops at the sandbox's process limit
(probed first by ``test_the_process_limit_holds``), the memory hog at 1 GiB per process.
"""

from __future__ import annotations

import csv
import os
import pwd
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest
from labs_fixture import synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab_grader import sandbox
from mhalab_grader.__main__ import main as grader_main
from mhalab_grader.kernel import GradingKernel

# Skipped where no sandbox can be made (macOS, no bwrap), but not in CI (.ci/run sets MHALAB_REQUIRE_SANDBOX=1).
_REQUIRED = os.environ.get("MHALAB_REQUIRE_SANDBOX") == "1"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox.problem() is not None and not _REQUIRED,
                                                   reason=str(sandbox.problem()))]
ROOT = Path(__file__).resolve().parent.parent
LIMITS = ["--memory-mb", "1024", "--processes", "64", "--disk-mb", "64", "--timeout", "20"]
MARKER = f"mhalab-attack-{os.getpid()}"
# Each class is graded by both paths: a kernel forked per submission from one that ran the instructor's cells
# before the first answer cell (the default on Linux), and a fresh kernel per submission.
PATHS = {"fork": [], "fresh": ["--no-fork"]}

# Each attack runs at the top of exercise 99.2's answer cell; `broke` is set when it got through, and then
# the cell hands in a wrong head count: an attack that works costs its point, one that fails scores 3.
ATTACKS = {
    "read_solution": "broke = len(open({solution!r}).read()) > 0",
    "read_other": "broke = len(open({other!r}).read()) > 0",
    "read_exercises": "broke = len(open({exercises!r}).read()) > 0",
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'hello')\n"
                "broke = True"),
    "fork_bomb": ("import os, time\nfor _ in range(10000):\n    if os.fork() == 0:\n        while True:\n"
                  "            try:\n                os.fork()\n"
                  "            except OSError:\n                time.sleep(0.05)\n"
                  "broke = False  # (the parent never gets here: its own forks fail, and it goes on forking)"),
    "fill_disk": ("import os\nfor folder in ('/dev/shm', '/tmp'):\n    try:\n        f = open(folder + '/fill', 'wb')\n"
                  "        for _ in range(10000):\n            f.write(b'0' * (1 << 20))\n            f.flush()\n"
                  "        broke = True\n    except OSError:\n        pass\n    f.close()"),
    "memory": "import torch\nhog = torch.ones(1 << 40, dtype=torch.uint8)\nbroke = True",
    "memory_slowly": "hog = []\nfor _ in range(100000):\n    hog.append(bytearray(1 << 24))\nbroke = True",
    "write_outside": ("broke = False\nfor path in {targets!r}:\n    try:\n        open(path, 'a').write('owned')\n"
                      "        broke = True\n    except OSError:\n        pass"),
    "kill_grader": ("import os, signal\nfor pid in ({grader}, os.getppid(), -1):\n"
                    "    try:\n        os.kill(pid, signal.SIGKILL)\n"
                    "    except OSError:\n        pass\nbroke = False"),
    "leave_process": ("import subprocess, sys\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(900)  # {marker}'],"
                      " start_new_session=True)\nimport os\nif os.fork() == 0:\n    os.setsid()\n"
                      "    os.execv(sys.executable,"
                      " [sys.executable, '-c', 'import time; time.sleep(900)  # {marker}'])\n"
                      "broke = False"),
    "print_gigabytes": ("import os, sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    print(chunk)\n"
                        "    sys.stderr.write(chunk)\nfor _ in range(1024):\n    os.write(1, chunk.encode())\n"
                        "broke = False"),
}
# What a failed attack leaves the submission: the exceptions it raised were caught, the answers are right
# (it may get less, down to 0: a fork bomb or a memory hog can leave its own kernel unable to go on).
HONEST = {kind: 3 for kind in ATTACKS}


def attack_notebook(code: str) -> nbformat.NotebookNode:
    nb = synthetic_notebook(answers={"n_heads": "n_heads = 3 if broke else 4"})
    body = "\n".join("    " + line for line in code.split("\n"))
    nb.cells[5].source = f"broke = False\ntry:\n{body}\nexcept BaseException:\n    broke = False\n" + nb.cells[5].source
    return nb


class Listener:
    """A TCP server on 127.0.0.1 that notes every connection (there must be none)."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port, self.connections = self.server.getsockname()[1], []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                self.connections.append(self.server.accept()[1])
            except OSError:
                return


def strays() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and MARKER.encode() in Path("/proc", entry, "cmdline").read_bytes():
                found.append(entry)
        except OSError:
            pass
    return found


def build(root: Path, port: int, grader_pid: int) -> tuple[dict, list[Path]]:
    """A class in ``root``: honest learners and one of each attack; {student: expected total}, host files
    the attacks try to write."""
    source = root / "source" / "99_fixture.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(synthetic_notebook(), source)
    submitted = root / "course" / "submitted"
    expected = {"correct_0": 3, "correct_1": 3, "partly_wrong_0": 2}
    honest = {"correct_0": synthetic_notebook(), "correct_1": synthetic_notebook(),
              "partly_wrong_0": synthetic_notebook(answers={"double": "return x + 2"})}
    targets = [source, submitted / "correct_0" / "99" / "99_fixture.ipynb", root / "graded" / "gradebook.csv",
               Path("/etc/mhalab-owned"), Path("/dev/mhalab-owned"), Path(sys.prefix) / "owned"]
    fields = {"solution": str(source), "other": str(targets[1]), "exercises": str(ROOT / "tests" / "labs_fixture.py"),
              "port": port, "targets": [str(t) for t in targets], "grader": grader_pid, "marker": MARKER}
    notebooks = {**honest, **{k: attack_notebook(code.format(**fields)) for k, code in ATTACKS.items()}}
    for student, nb in notebooks.items():
        path = submitted / student / "99" / "99_fixture.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return {**expected, **HONEST}, targets


def check_outcome(root: Path, expected: dict, targets: list[Path], listener: Listener, before: dict) -> None:
    with open(root / "graded" / "gradebook.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(expected)
    got = {student: float(row["total"]) for student, row in rows.items()}
    print("totals:", got)
    assert {s: got[s] for s in expected if s not in ATTACKS} == {s: t for s, t in expected.items() if s not in ATTACKS}
    # an attack may cost its own submission points (a fork bomb leaves no process for its later cells), never
    # bring it more than the honest answers it also holds
    beyond = {s: got[s] for s in ATTACKS if not 0 <= got[s] <= HONEST[s]}
    assert beyond == {}, "an attack got more than its honest score"
    assert listener.connections == []
    assert strays() == [], "a submission's process outlived its grading"
    for target in targets:
        text = target.read_text() if target.exists() else None
        assert text is None or "owned" not in text, target
    assert before == {t: t.read_bytes() for t in targets if t.exists() and t.name != "gradebook.csv"}


def test_the_process_limit_holds(tmp_path):
    """A harmless probe before the fork bomb: 80 sleeping children against a limit of 32 processes."""
    kernel = GradingKernel({"99": [[1, "double a number"]]}, cwd=tmp_path, timeout=30,
                           limits=sandbox.Limits(processes=32, memory_mb=1024))
    try:
        assert kernel.run_cell("import os, time\nstarted = 0\nfor _ in range(80):\n    pid = os.fork()\n"
                               "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
                               "    started += 1\n") == "BlockingIOError"
        kernel.run_cell("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=2)\n    net = 1\n"
                        "except OSError:\n    net = 0\n"
                        "import _mhalab_grading\n_mhalab_grading.ANSWERS['99.1'] = (started, net)")
        assert kernel.value("99.1") == (pytest.approx(32, abs=31), 0)
        assert kernel.value("99.1")[0] < 32
    finally:
        kernel.close()


def test_the_memory_limit_is_on_top_of_the_libraries(tmp_path):
    """--memory-mb is what the learner's code may add to what Python and torch map (0.6 GB in torch's CPU build,
    3.3 GB in its CUDA build): 256 MB lets a kernel of either build allocate 128 MB and refuses 512 MB."""
    kernel = GradingKernel({"99": [[1, "double a number"]]}, cwd=tmp_path, timeout=60,
                           limits=sandbox.Limits(memory_mb=256))
    try:
        kernel.run_cell("import torch\nsmall = torch.ones(128 << 20, dtype=torch.uint8)\nsmall += 1\n"
                        "try:\n    big = torch.ones(512 << 20, dtype=torch.uint8)\n    refused = 0\n"
                        "except (MemoryError, RuntimeError):\n    refused = 1\n"
                        "import _mhalab_grading\n_mhalab_grading.ANSWERS['99.1'] = (int(small[0]), refused)")
        assert kernel.value("99.1") == (2, 1)
    finally:
        kernel.close()


@pytest.mark.parametrize("path", PATHS)
def test_attacks_among_honest_learners_as_this_user(tmp_path, path):
    listener = Listener()
    expected, targets = build(tmp_path, listener.port, os.getpid())
    before = {t: t.read_bytes() for t in targets if t.exists()}
    assert grader_main(["grade", str(tmp_path / "course"), "--source", str(tmp_path / "source"), "-j", "2",
                        "--out", str(tmp_path / "graded"), *LIMITS, *PATHS[path]]) == 0
    check_outcome(tmp_path, expected, targets, listener, before)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the grader as another user: needs root (CI runs as root)")
@pytest.mark.parametrize("path", PATHS)
def test_attacks_among_honest_learners_as_an_unprivileged_user(path):
    user = next((p for p in pwd.getpwall() if p.pw_name == "nobody"), None)
    uid = user.pw_uid if user else 65534
    root = Path(tempfile.mkdtemp(prefix="mhalab-unprivileged-"))
    try:
        listener = Listener()
        expected, targets = build(root, listener.port, os.getpid())
        before = {t: t.read_bytes() for t in targets if t.exists()}
        for folder, _, files in os.walk(root):
            os.chmod(folder, 0o777)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)  # the grader's user reads them; they stay root's
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "grader"), str(ROOT / "tests")]),
               "HOME": str(root)}
        args = ["grade", str(root / "course"), "--source", str(root / "source"), "-j", "2", "--out",
                str(root / "graded"), *LIMITS, *PATHS[path]]
        code = ("import sys, labs_fixture  # registers notebook 99\nfrom mhalab_grader.__main__ import main\n"
                f"sys.exit(main({args!r}))")
        opened = opened_for_others([sys.executable, sys.prefix, sys.base_prefix, str(ROOT), str(root)])
        command = [*opened, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c", code]
        run = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=1200)
        assert run.returncode == 0, run.stderr[-3000:] + seen_by(uid, env, opened)
        check_outcome(root, expected, targets, listener, before)
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        time.sleep(0)


def opened_for_others(paths: list[str]) -> list[str]:
    """A command prefix that runs what follows (as root) in a mount namespace of its own in which every folder
    closed to other users above ``paths`` is open: root's Python often lives under /root (mode 700), where an
    instructor grading as an ordinary user has a Python of their own. Each closed folder is covered by a tmpfs
    of mode 755 holding binds of what ``paths`` need below it; nothing changes outside the namespace. A closed
    folder in ``paths`` itself (a clone in a folder of mode 700, as `mktemp -d` makes) gets binds of all it holds."""
    def shut(folder: str) -> bool:  # a folder other users cannot pass through
        return os.path.isdir(folder) and not os.stat(folder).st_mode & 0o001

    closed: dict[str, set[str]] = {}
    for path in paths:
        for real in {os.path.abspath(path), os.path.realpath(path)}:
            parts = Path(real).parts
            for depth in range(1, len(parts) - 1):
                folder = os.path.join(*parts[:depth + 1])
                if shut(folder):
                    closed.setdefault(folder, set()).add(parts[depth + 1])
            if shut(real):
                closed.setdefault(real, set()).update(os.listdir(real))
    if not closed:
        return []
    script, n = ["set -e", 'stash=$(mktemp -d)'], 0
    for folder in sorted(closed, key=lambda f: f.count("/")):  # outer first: an inner one is reached through it
        names = sorted(closed[folder])
        for name in names:
            kind = "mkdir -p" if os.path.isdir(os.path.join(folder, name)) else "touch"
            script += [f'{kind} "$stash/{n}"', f'mount --bind "{folder}/{name}" "$stash/{n}"']
            n += 1
        script.append(f'mount -t tmpfs -o mode=0755 tmpfs "{folder}"')
        for i, name in enumerate(names, start=n - len(names)):
            script += [f'mkdir -p "{folder}/{name}"' if os.path.isdir(os.path.join(folder, name))
                       else f'touch "{folder}/{name}"', f'mount --bind "$stash/{i}" "{folder}/{name}"']
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(script), "opened"]


def seen_by(uid: int, env: dict, opened: list[str]) -> str:
    """What ``uid`` sees of the interpreter and the folders the sandbox would show (for a failure's message)."""
    code = ("import os, sys\nfrom mhalab_grader import sandbox\n"
            "print('hops', sandbox._hops(sys.executable))\nprint('binds', sandbox._python_paths())\n"
            "for hop in sandbox._hops(sys.executable):\n    print(hop, os.path.exists(hop), os.path.islink(hop))")
    run = subprocess.run([*opened, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                          "-c", code], env=env, capture_output=True, text=True, timeout=60)
    mounts = subprocess.run(["findmnt", "-T", sys.prefix], capture_output=True, text=True).stdout
    return f"\nas uid {uid}:\n{run.stdout}{run.stderr[-1000:]}\nthe venv's mount:\n{mounts}"


def test_without_the_sandbox_the_same_read_gets_through(tmp_path):
    """The attacks above can fail the test: unsandboxed (--no-sandbox), reading the solution costs the point."""
    listener = Listener()
    build(tmp_path, listener.port, os.getpid())
    submission = tmp_path / "course" / "submitted" / "read_solution" / "99" / "99_fixture.ipynb"
    out = tmp_path / "alone"
    assert grader_main(["grade", str(submission), "--source", str(tmp_path / "source"), "--no-sandbox",
                        "--timeout", "20", "--out", str(out)]) == 0
    with open(out / "gradebook.csv") as f:
        assert [float(r["total"]) for r in csv.DictReader(f)] == [2.0]
