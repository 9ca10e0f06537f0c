"""The grading kernel: a process of its own that runs a submission's cells and calls its answers on request
(:mod:`mhalab_grader.worker` is its side), with a copy of mhalab whose ``mhalab.labs`` only hands answers over
(:mod:`mhalab_grader.kernel_labs`), in the sandbox of :mod:`mhalab_grader.sandbox` (or, told ``sandbox=False``, as
the grader's own user, with the sweep that kills whatever the submission started and left behind).

Not a Jupyter kernel run by nbclient: nbclient executes cells (with per-cell timeouts) but talks to its kernel
over ZMQ sockets, and grading needs more than running cells: calling the learner's functions on hidden inputs
and getting back plain data, a request nbclient has no message for. Two inherited pipes carry both, and need
no network in the sandbox.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from mhalab.labs.calls import PACKAGE
from mhalab.labs.verdicts import STRICT_ENV

from . import forking, kernel_labs, worker
from . import sandbox as jail

_SANDBOX: dict[str, str] = {}
_SANDBOX_LOCK = threading.Lock()


#: The modules of mhalab.labs the grading kernel keeps, those its worker imports: leaves that judge nothing and hold
#: no answer (what a check concludes, calling an answer, plain data). The exercise modules, core, judging and calls
#: stay out.
KERNEL_LABS = tuple(name.rsplit(".", 1)[1] + ".py" for name in worker.KEPT)
_LABS = os.path.join(PACKAGE, "labs")


def _kept(folder: str, names: list[str]) -> list[str]:
    """What the package's copy leaves out: caches, and every module of mhalab/labs but the kernel's leaves."""
    return [n for n in names if n == "__pycache__" or (folder == _LABS and n not in KERNEL_LABS)]


def sandbox() -> str:
    """A folder (made once per process) holding the grading kernel's code: a copy of the mhalab package without
    its exercise modules and checkers, whose ``mhalab.labs`` is :mod:`mhalab_grader.kernel_labs`, and the grader's
    own worker and fork code."""
    with _SANDBOX_LOCK:
        if "path" in _SANDBOX and os.path.isdir(_SANDBOX["path"]):
            return _SANDBOX["path"]
        root = tempfile.mkdtemp(prefix="mhalab-sandbox-")
        shutil.copytree(PACKAGE, os.path.join(root, "pkg", "mhalab"), ignore=_kept)
        shutil.copy(kernel_labs.__file__, os.path.join(root, "pkg", "mhalab", "labs", "__init__.py"))
        shutil.copy(worker.__file__, os.path.join(root, "_mhalab_grading.py"))
        shutil.copy(forking.__file__, os.path.join(root, "_mhalab_fork.py"))
        for folder, dirs, files in os.walk(root):  # readable by the sandbox's user
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        _SANDBOX["path"] = root
        return root


def spec_of(exercises: Any) -> dict[str, list]:
    """What the kernel's ``mhalab.labs`` knows of an assignment's exercises: ``{notebook: [[number, title, label]]}``
    (:mod:`mhalab_grader.kernel_labs`)."""
    spec: dict[str, list] = {}
    for ex in exercises:
        spec.setdefault(ex.notebook, []).append([ex.number, ex.title, ex.label])
    return spec


class KernelGone(Exception):
    """The grading kernel died, or was stopped because it ran past its time."""


_ACTIVE: set[int] = set()  # pids of the grading kernels running now (any thread)
_ACTIVE_LOCK = threading.Lock()


def _become_subreaper() -> None:
    """Orphans of the submission's processes (double fork, setsid) are reparented to this process, so they can
    be found and killed (Linux; elsewhere they escape to init: use a container)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass


def _strays() -> list[int]:
    """Children of this process that no grading kernel is and that left this process's session: what a
    submission started and abandoned (reparented here)."""
    with _ACTIVE_LOCK:  # no grading kernel starts while the scan runs
        return _scan_strays()


def _scan_strays() -> list[int]:
    me, mine = os.getpid(), os.getsid(0)
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid, ppid, sid = int(entry), int(fields[1]), int(fields[3])
        if ppid == me and pid not in _ACTIVE and sid != mine:
            found.append(pid)
    return found


def _kill_strays() -> None:
    for _ in range(50):  # a killed stray's own children are reparented here in turn
        pids = _strays()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


class GradingKernel:
    """A process that runs a notebook's cells and calls its answers on request (:mod:`mhalab_grader.worker`):
    a session of its own, the sandbox's mhalab first on its path, the exercise modules refused on import."""

    GRACE_S = 10.0  # after an interrupt, how long the kernel gets to report back before it is killed

    def __init__(self, spec: dict, *, cwd: str | Path, timeout: float | None = 600, sandboxed: bool = True,
                 limits: jail.Limits | None = None, fork_fd: int | None = None):
        """``sandboxed``: in the sandbox (:class:`mhalab_grader.sandbox.SandboxUnavailable` where none can be
        made); else as this user, in ``cwd``. ``limits``: what the kernel may use (default :class:`Limits`).
        ``fork_fd``: a socket over which the grader sends pipe ends; the kernel then forks a kernel per
        submission on request (:mod:`mhalab_grader.zygote`)."""
        _become_subreaper()
        limits = limits or jail.Limits()
        if sandboxed and jail.problem():
            raise jail.SandboxUnavailable(jail.problem())
        root = sandbox()
        self.timeout, self.dead, self.sandboxed = timeout, False, sandboxed
        self.home = tempfile.mkdtemp(prefix="mhalab-kernel-")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()
        extra = () if fork_fd is None else (fork_fd,)
        argv = [sys.executable, os.path.join(root, "_mhalab_grading.py"), *map(str, (to_child, from_child, *extra))]
        if sandboxed:
            argv, env = jail.wrap(argv, code=root, home=self.home, limits=limits)
            cwd = self.home
        else:
            keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                    if p and not os.path.isdir(os.path.join(p, "mhalab"))]
            env = {k: v for k, v in os.environ.items() if k not in (STRICT_ENV, "PYTHONPATH")}
            env.update(PYTHONPATH=os.pathsep.join([root, os.path.join(root, "pkg"), *keep]), MPLBACKEND="Agg",
                       IPYTHONDIR=self.home, PYTHONDONTWRITEBYTECODE="1")
        env.update(MHALAB_GRADING_SPEC=json.dumps(spec),
                   MHALAB_GRADING_LIMITS=json.dumps(limits.rlimits(processes=sandboxed)))
        with _ACTIVE_LOCK:  # (held from the start: another thread's sweep must not take it for a stray)
            # what the submission prints goes nowhere: the grader reads answers, not output (no size to fill)
            self.process = subprocess.Popen(
                argv, pass_fds=(to_child, from_child, *extra), cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            _ACTIVE.add(self.process.pid)
        os.close(to_child)
        os.close(from_child)
        self._request(None, timeout=max(120.0, timeout or 0))  # its "ready"
        self.worker_pid = _find_worker(self.process.pid) if sandboxed else self.process.pid

    def _request(self, message: dict | None, arrays: list | None = None, *, timeout: float | None) -> tuple[dict, Any]:
        if self.dead:
            raise KernelGone("the grading kernel is gone")
        try:
            if message is not None:
                worker.send(self._w, message, arrays)
            return worker.receive(self._r, timeout)
        except TimeoutError:
            self.interrupt()
            try:
                reply = worker.receive(self._r, self.GRACE_S)
            except (TimeoutError, EOFError, OSError, ValueError):
                self.kill()
                raise KernelGone(f"it ran past {timeout:g} s and did not stop when interrupted") from None
            return {**reply[0], "timed_out": True}, reply[1]
        except (EOFError, OSError, ValueError) as error:
            self.kill()
            raise KernelGone(f"the grading kernel died ({type(error).__name__})") from None

    def interrupt(self) -> None:
        try:
            os.kill(self.worker_pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def run_cell(self, source: str) -> str | None:
        """Run one cell; the class name of what it raised, or None."""
        reply, _ = self._request({"op": "run", "source": source}, timeout=self.timeout)
        if reply.get("timed_out"):
            return f"stopped after {self.timeout:g} s (KeyboardInterrupt)"
        error = reply.get("error")
        return error[:100] if isinstance(error, str) else None if error is None else "an error"

    def handed_in(self) -> dict[str, tuple[bool, str]]:
        """{exercise key: (callable, description)} of what the cells handed to ``q.check``."""
        reply, _ = self._request({"op": "answers"}, timeout=60)
        callables, descriptions = reply.get("callable", {}), reply.get("describe", {})
        if not isinstance(callables, dict) or not isinstance(descriptions, dict):
            return {}
        return {str(k): (bool(callables.get(k)), str(descriptions.get(k, ""))[:200]) for k in reply.get("keys", [])}

    def value(self, key: str) -> Any:
        reply, arrays = self._request({"op": "value", "key": key}, timeout=60)
        if "failed" in reply:
            return worker.Opaque(f"something that could not be sent ({reply['failed']})")
        return worker.decode(reply.get("value"), arrays)

    def call(self, key: str, args: tuple, *, facts: tuple = (), forbid: tuple = ()) -> tuple[str, Any, dict]:
        """Call answer ``key`` on ``args`` in the kernel: ("returned", value, facts) or ("raised", (class, message,
        where), facts), or ("unbound", parameters, {}) when it cannot take them."""
        out: list = []
        request = {"op": "call", "key": key, "args": worker.encode(list(args), out), "facts": list(facts),
                   "forbid": list(forbid)}
        try:
            reply, arrays = self._request(request, out, timeout=self.timeout)
        except KernelGone as gone:
            return "raised", ("TimeoutError" if "ran past" in str(gone) else "KernelGone", str(gone), ""), {}
        found = reply.get("facts") if isinstance(reply.get("facts"), dict) else {}
        if reply.get("timed_out"):
            return "raised", ("TimeoutError", f"it ran past {self.timeout:g} s", ""), found
        try:
            if "returned" in reply:
                return "returned", worker.decode(reply["returned"], arrays), found
            if "unbound" in reply:
                return "unbound", [str(p) for p in reply["unbound"]][:20], {}
        except Exception as error:  # malformed data from the kernel: the learner's code wrote it
            return "raised", ("RuntimeError", f"what came back could not be read ({type(error).__name__})", ""), {}
        if isinstance(reply.get("raised"), list) and len(reply["raised"]) == 3:
            return "raised", tuple(str(x)[:500] for x in reply["raised"]), found
        failed = str(reply.get("failed", "no usable reply from the grading kernel"))[:300]
        return "raised", ("RuntimeError", failed, ""), found

    # The runner of a grading check (``Exercise.verdict(answer, runner=kernel)``, :mod:`mhalab.labs.calls`): the
    # answer runs here, in the kernel, and what it returned comes back as plain data.
    def run(self, check: Any, fn: Any, args: tuple, *, facts: tuple, forbid: tuple, allow: tuple,
            copy_args: bool) -> tuple[str, Any, dict]:
        return self.call(check.key, args, facts=facts, forbid=forbid)  # (the kernel gets its own copy of args)

    def received(self, answer: Any) -> Any:
        return answer  # a value handed in came over the transport already (:meth:`value`)

    def kill(self) -> None:
        self.dead = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the kernel and all it started in its session
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()

    def close(self) -> None:
        """Stop the kernel and everything it started; only then is a grade final."""
        if not self.dead:
            try:
                worker.send(self._w, {"op": "stop"})
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self.process.pid)
        _kill_strays()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)


def _find_worker(top: int) -> int:
    """The pid (here) of the worker, the first python under ``top`` (the sandbox's outer process) that runs it;
    the grader interrupts a cell by signalling it (bwrap does not pass SIGINT on)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            stat = Path("/proc", entry, "stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat:
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    queue = [top]
    while queue:  # breadth first: the worker before anything it started
        pid = queue.pop(0)
        try:
            command = Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"_mhalab_grading.py") for part in command[1:2]):
            return pid
        queue += sorted(children.get(pid, []))
    return top


class _Handed:
    """Stands in here for a function the learner handed in: calling it goes through the grading kernel (the
    check's runner)."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        raise RuntimeError("an answer handed in is only called through its check (check.call)")
