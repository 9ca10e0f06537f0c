"""The sandbox a grading kernel runs in (Linux): bubblewrap (``bwrap``, Debian's ``bubblewrap``, what Flatpak
uses) in every namespace it offers, behind util-linux's ``unshare``, ``mount`` and ``setpriv``; no jail of our own.

What the submission's code sees and may do:

- no network: a network namespace of its own with only a loopback nobody else listens on. The grader talks
  to the kernel over two pipes it opened before the kernel started (:mod:`mhalab_grader.worker`), not over
  ZMQ on TCP as Jupyter kernels do (nbclient / jupyter_client), so nothing in the sandbox needs a socket
  (with ``--unshare-net`` TCP on 127.0.0.1 would reach only the sandbox's own loopback anyway; pipes also
  spare the IPC files a ZMQ ``ipc`` transport would need in a shared directory);
- the system read-only: ``/usr``, ``/etc``, the Python it runs (its prefixes), nothing else of the machine: no
  home folders, no course checkout (the instructor's notebooks and solutions), no other submission (the
  grader sends the cells through the pipe), a ``/proc`` of its own pid namespace, a minimal ``/dev``;
- one writable folder, ``/tmp`` (its working directory and home; ``/dev/shm`` is a folder of it): a tmpfs of
  ``disk_mb`` and ``inodes`` at most, gone with it;
- resource limits (:data:`Limits`, set by the worker on itself before any learner code runs, inherited by
  all it starts): memory per process (``RLIMIT_AS``, on top of what Python and torch map), processes and
  threads (``RLIMIT_NPROC``, counted in the sandbox's own user namespace, so a fork bomb stops at the limit
  without touching the instructor's processes), open files, file size; time is the grader's per-cell and
  per-call timeout; what it prints goes to ``/dev/null`` (the grader reads answers, not output);
- its own pid namespace: it cannot see or signal the grader or another submission; when the kernel is
  stopped the namespace goes and every process left in it is killed by the kernel;
- when the grader runs as root, the kernel runs as ``uid`` (default 65534, "nobody") with no capabilities:
  root makes the mounts in a mount namespace of its own, then ``setpriv`` drops to ``uid`` before bwrap.
  Run as another user, bwrap needs unprivileged user namespaces (Debian, Ubuntu and Fedora allow them).

Not bounded: the memory of all a submission's processes together (each one is, so at most ``processes``
times ``memory_mb``; a cgroup would bound the sum, but an ordinary user cannot make one), CPU shares
between kernels run at once (``-j``). Without Linux (macOS, Windows), bwrap or user namespaces, :func:`problem`
says why and the grader refuses unless told ``--no-sandbox``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Limits", "SandboxUnavailable", "problem", "wrap"]

#: Where the grading code is seen inside the sandbox; its only writable folder.
CODE, SCRATCH = "/grading", "/tmp"
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Limits:
    """What one grading kernel may use (README, "For instructors", says how to change them)."""

    memory_mb: int = 4096    # address space each process may add to what Python and torch map when the
                             # learner's code starts: an allocation past it raises MemoryError
    processes: int = 256     # processes and threads at once (torch starts a thread per core)
    open_files: int = 1024
    disk_mb: int = 512       # the private /tmp (also the largest file)
    inodes: int = 20000      # files in it

    def rlimits(self, *, processes: bool = True) -> dict[str, int]:
        """The ``resource`` limits the worker sets on itself; ``processes=False`` without a sandbox (there
        ``RLIMIT_NPROC`` would count every process of the instructor's user)."""
        limits = {"RLIMIT_AS": self.memory_mb << 20, "RLIMIT_NOFILE": self.open_files,
                  "RLIMIT_FSIZE": self.disk_mb << 20, "RLIMIT_CORE": 0}
        return {**limits, "RLIMIT_NPROC": self.processes} if processes else limits

    def as_dict(self) -> dict:
        return asdict(self)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here; the message says why and what to do."""


ADVICE = ("grade in a Linux container with no network (docker run --network none ...), or, for notebooks you "
          "trust, pass --no-sandbox")


def _missing_tool() -> str | None:
    for tool, package in (("bwrap", "bubblewrap"), ("unshare", "util-linux"), ("mount", "mount"),
                          ("setpriv", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian/Ubuntu: sudo apt-get install {package})"
    return None


@functools.cache
def problem(uid: int = 65534) -> str | None:
    """Why no sandbox can be made here (None: it can): tried once per process with this Python."""
    if not sys.platform.startswith("linux"):
        name = {"darwin": "macOS", "win32": "Windows"}.get(sys.platform, sys.platform)
        return f"the grading sandbox needs Linux's namespaces, and this is {name}: {ADVICE}"
    missing = _missing_tool()
    if missing:
        return f"no grading sandbox: {missing}; or {ADVICE}"
    hidden = [hop for hop in _hops(sys.executable) if not os.path.lexists(hop)]
    if hidden:  # exec may still follow a link this user cannot look through; the sandbox can show only what it sees
        return (f"the grading sandbox cannot show this user its Python: {sys.executable} leads to {hidden[0]}, "
                f"which this user (uid {os.geteuid()}) cannot see (a folder above it is closed to it: a venv "
                f"made from another user's Python?); grade with a Python of this user's own, or {ADVICE}")
    with tempfile.TemporaryDirectory(prefix="mhalab-probe-") as home:
        os.chmod(home, 0o755)
        code = Path(home, "code")
        code.mkdir()
        argv, env = wrap([sys.executable, "-c", "import sys; print('sandboxed')"], code=str(code), home=home,
                         limits=Limits(), uid=uid)
        try:
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"the grading sandbox could not start ({error}); {ADVICE}"
    if run.returncode != 0 or run.stdout.strip() != "sandboxed":
        why = " / ".join(run.stderr.strip().splitlines()[-3:] or ["no output"])[-600:]
        if "execvp" in why:  # say what the sandbox showed of the interpreter, so the missing piece can be named
            why += (f" (the interpreter {sys.executable} is reached by {' -> '.join(_hops(sys.executable))}; "
                    f"shown in the sandbox: {', '.join(shown for _, shown in _python_paths())})")
        hint = ("" if os.geteuid() == 0 else " (are unprivileged user namespaces allowed? "
                "sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)")
        return f"the grading sandbox does not start on this machine: {why}{hint}; {ADVICE}"
    return None


def _hops(path: str) -> list[str]:
    """``path`` and every path its symbolic links lead through to the file itself (a venv's ``bin/python``
    -> ``python3`` -> ``/root/.pyenv/versions/3.11.7/bin/python3`` -> ``python3.11``), each absolute."""
    hops = [os.path.abspath(path)]
    while os.path.islink(hops[-1]) and len(hops) < 40:  # 40: the kernel's own limit on links followed
        hops.append(os.path.normpath(os.path.join(os.path.dirname(hops[-1]), os.readlink(hops[-1]))))
    return hops


def _python_paths() -> list[tuple[str, str]]:
    """The folders the kernel's Python needs (its prefixes: the venv and the Python it was made from), as
    (where it is, where the sandbox shows it): each at its real path and at every path the interpreter is
    reached by (``sys.prefix`` as given, each link of ``sys.executable``), since exec follows those literally:
    a venv made by ``python -m venv`` links to its Python, and any folder above may be a link too."""
    wanted = {}
    folders = [sys.prefix, sys.base_prefix, sys.exec_prefix]
    folders += [os.path.dirname(hop) for hop in _hops(sys.executable)]
    for folder in folders:
        real = os.path.realpath(folder)
        for shown in (os.path.abspath(folder), real):
            if os.path.isdir(real) and not any(shown == s or shown.startswith(s + "/") for s in SYSTEM):
                wanted.setdefault(shown, real)
    # a folder inside another shown one is seen through it (when it is the same folder there)
    return sorted(((real, shown) for shown, real in wanted.items()
                   if not any(shown.startswith(other + "/")
                             and os.path.relpath(real, wanted[other]) == os.path.relpath(shown, other)
                             for other in wanted)), key=lambda bind: bind[1])


# Run by `sh` in a mount namespace of its own (and, for a user other than root, a user namespace): mount the
# private /tmp, bind read-only into the stage what the kernel may see (bind mounts are reached without the
# permissions of the folders above them: /root/.pyenv stays readable after dropping root), drop root, run bwrap.
_SCRIPT = r'''set -e
scratch=$1; stage=$2; size=$3; inodes=$4; shift 4
mount -t tmpfs -o "size=$size,nr_inodes=$inodes,mode=1777" tmpfs "$scratch"
mkdir -m 1777 "$scratch/.shm"
i=0
while [ "$1" != "--" ]; do
    mkdir -p "$stage/$i"; mount --bind "$1" "$stage/$i"; mount -o remount,bind,ro "$stage/$i"; i=$((i+1)); shift
done
shift
exec "$@"
'''


def wrap(argv: list[str], *, code: str, home: str, limits: Limits, uid: int = 65534) -> tuple[list[str], dict]:
    """The command line and environment that run ``argv`` (whose paths under ``code`` are given as under
    :data:`CODE`) in the sandbox; ``home`` is the grader's folder for this kernel (its mount points)."""
    scratch, stage = os.path.join(home, "scratch"), os.path.join(home, "stage")
    for folder in (scratch, stage):
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o755)
    os.chmod(home, 0o755)
    binds = [*_python_paths(), (code, CODE)]
    sources = [source for source, _ in binds]
    bwrap = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", "1000", "--gid", "1000",
             "--hostname", "grading"]
    for path in SYSTEM:
        if os.path.islink(path):
            bwrap += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            bwrap += ["--ro-bind", path, path]
    # /dev is a tmpfs of bwrap's with no size: read-only, its /dev/shm in the private, bounded /tmp
    bwrap += ["--proc", "/proc", "--dev", "/dev", "--bind", scratch, SCRATCH, "--bind", f"{scratch}/.shm", "/dev/shm"]
    for i, (_, shown) in enumerate(binds):  # after the private /tmp, so that a Python under /tmp stays seen
        bwrap += ["--ro-bind", f"{stage}/{i}", shown]
    bwrap += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SCRATCH, "--"]
    inner = [a.replace(code, CODE) for a in argv]
    if os.geteuid() == 0:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--"]
        outer = ["unshare", "--mount", "--propagation", "private", "--"]
    else:
        drop, outer = [], ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--"]
    command = [*outer, "sh", "-c", _SCRIPT, "sandbox", scratch, stage, f"{limits.disk_mb}m", str(limits.inodes),
               *sources, "--", *drop, *bwrap, *inner]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "IPYTHONDIR": f"{SCRATCH}/.ipython",
           "PYTHONPATH": f"{CODE}:{CODE}/pkg"}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return command, env
