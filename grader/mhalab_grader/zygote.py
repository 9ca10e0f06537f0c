"""The fork path of grading a class (Linux, in the sandbox; ``--no-fork`` or elsewhere, a fresh kernel per
submission): the instructor's cells before a notebook's first answer cell are the same for every submission,
so a :class:`Prepared` kernel runs them once per assignment, and each submission's kernel is a fork of it
(:class:`ForkedKernel`, isolated as :mod:`mhalab_grader.forking` says) that runs only the rest: the answer cells
and the instructor's later cells. The hidden inputs are drawn by the grader after the fork, per call, as before.
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

from . import sandbox as jail
from . import worker
from .kernel import GradingKernel, KernelGone, _kill_strays

__all__ = ["ForkedKernel", "Prepared"]


class Prepared:
    """A sandboxed grading kernel that has run ``prefix`` ([(cell index, source)]) of notebook ``nb_id`` and forks
    a kernel per submission (:meth:`fork`). ``usable`` is False when a cell killed it (then grade as before)."""

    def __init__(self, nb_id: str, spec: dict, prefix: list[tuple[int, str]], *, timeout: float | None,
                 limits: jail.Limits | None = None, jobs: int = 1):
        self.nb_id, self.prefix, self.limits = nb_id, list(prefix), limits or jail.Limits()
        self.errors: list[str] = []  # "cell 3: ValueError", as a fresh kernel would report them
        self.usable, self._lock = True, threading.Lock()
        self._home = tempfile.mkdtemp(prefix="mhalab-prepared-")
        self._socket, theirs = socket.socketpair()
        # its children share its process count one namespace up: room for each of `jobs` at once
        ours = dataclasses.replace(self.limits, processes=self.limits.processes * (jobs + 2))
        try:
            self.kernel = GradingKernel(spec, cwd=self._home, timeout=timeout, limits=ours, fork_fd=theirs.fileno())
        finally:
            theirs.close()
        for index, source in self.prefix:
            try:
                error = self.kernel.run_cell(source)
            except KernelGone:
                self.usable = False
                break
            if error and error != "NotImplementedError":
                self.errors.append(f"cell {index}: {error}")

    def fork(self, timeout: float | None, limits: jail.Limits | None = None) -> ForkedKernel:
        """A kernel for one submission, in the state the prepared cells left (KernelGone when it cannot be made)."""
        limits = limits or self.limits
        ends = (*os.pipe(), *os.pipe())  # (child reads, grader writes, grader reads, child writes)
        request = {"op": "fork", "limits": limits.rlimits(), "disk_mb": limits.disk_mb, "inodes": limits.inodes}
        try:
            with self._lock:
                if self.kernel.dead:
                    raise EOFError
                worker.send(self.kernel._w, request)
                socket.send_fds(self._socket, [b"f"], [ends[0], ends[3]])
                reply, _ = worker.receive(self.kernel._r, 60)
            if not isinstance(reply.get("pid"), int):
                raise ValueError(str(reply.get("failed", reply))[:200])
        except (OSError, EOFError, TimeoutError, ValueError) as error:
            for fd in ends[1:3]:
                os.close(fd)
            raise KernelGone(f"the prepared kernel could not fork ({type(error).__name__}: {error})") from None
        finally:
            os.close(ends[0])
            os.close(ends[3])
        return ForkedKernel(self, reply["pid"], ends[1], ends[2], timeout)

    def close(self) -> None:
        self.kernel.close()
        self._socket.close()
        shutil.rmtree(self._home, ignore_errors=True)


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, pid in its innermost namespace)} of every process seen here."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            status = Path("/proc", entry, "status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "PPid" in fields and "NSpid" in fields:
            found[int(entry)] = (int(fields["PPid"]), int(fields["NSpid"].split()[-1]))
    return found


def _child(processes: dict, parent: int, inner: int | None = None) -> int:
    found = [p for p, (pp, ns) in processes.items() if pp == parent and inner in (None, ns)]
    if len(found) != 1:
        raise KernelGone(f"the forked kernel's processes were not found ({len(found)} candidates)")
    return found[0]


class ForkedKernel(GradingKernel):
    """One submission's grading kernel, forked from a :class:`Prepared` one: the same requests over its own pipes;
    interrupted and stopped through pidfds of its worker and of its namespace's first process."""

    def __init__(self, prepared: Prepared, pid: int, write_fd: int, read_fd: int, timeout: float | None):
        self.timeout, self.dead, self.sandboxed = timeout, False, True
        self._w, self._r, self._pidfds = write_fd, read_fd, []
        try:
            ready, _ = self._request(None, timeout=120)  # once it is in its namespaces
            if not ready.get("ready"):
                raise KernelGone(str(ready.get("failed", ready))[:300])
            processes = _processes()
            top = _child(processes, prepared.kernel.worker_pid, pid)
            init = _child(processes, top)
            self.worker_pid = _child(processes, init)
            self._pidfds = [os.pidfd_open(init), os.pidfd_open(self.worker_pid)]
        except (KernelGone, OSError) as error:
            self.close()
            raise KernelGone(f"the forked kernel did not start ({error})") from None

    def interrupt(self) -> None:
        if len(self._pidfds) == 2:
            try:
                signal.pidfd_send_signal(self._pidfds[1], signal.SIGINT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill its namespace's first process, which ends every process in that namespace; wait until it has."""
        self.dead = True
        if self._pidfds:
            try:
                signal.pidfd_send_signal(self._pidfds[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
            select.select([self._pidfds[0]], [], [], 30)

    def close(self) -> None:
        """Kill it (it has nothing to save, and nothing it leaves outlives its namespace): then a grade is final."""
        self.kill()
        _kill_strays()
        for fd in (self._r, self._w, *self._pidfds):
            try:
                os.close(fd)
            except OSError:
                pass
        self._pidfds = []
