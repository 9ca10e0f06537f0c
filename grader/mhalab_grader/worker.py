"""The grading kernel's side of grading, and the plain data that passes between it and the grader.

``python worker.py FD_IN FD_OUT`` runs a notebook's cells as the grader sends them, then calls the
learner's answers on the inputs the grader sends and sends back what they returned. It is copied out of
the package for the grading kernel, as ``_mhalab_grading.py``, beside a copy of mhalab whose ``mhalab.labs`` holds
only the leaf modules it imports (:mod:`mhalab.labs.invoke`, :mod:`mhalab.labs.plain`, :mod:`mhalab.labs.verdicts`)
and :mod:`mhalab_grader.kernel_labs` as its ``__init__`` (``q.check(answer)`` only notes the answer); an import
hook refuses the rest. Before any of the learner's code runs it lowers its own resource limits (:func:`limit`),
which nothing it starts can raise again.

Everything that crosses is JSON plus an ``.npz`` of arrays (``allow_pickle=False``, :mod:`mhalab.labs.plain`): no
code is loaded on either side, over two pipes the grader opened (no socket, so the kernel needs no network at
all).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import random
import select
import struct
import sys
import time
from typing import Any

import numpy as np
import torch

from mhalab.labs.invoke import Opaque, describe, invoke, where
from mhalab.labs.plain import decode, encode

__all__ = ["Opaque", "decode", "encode", "limit", "receive", "send", "serve"]

MAX_FRAME = 1 << 30  # bytes one message may take (a learner's answer could return anything)

# --------------------------------------------------------------------------- plain data


def pack(message: dict, arrays: list | None = None) -> bytes:
    """One frame: lengths, the JSON header, the npz of ``arrays``."""
    header = json.dumps(message).encode()
    blob = b""
    if arrays:
        buffer = io.BytesIO()
        np.savez(buffer, **{f"a{i}": a for i, a in enumerate(arrays)})
        blob = buffer.getvalue()
    return struct.pack("<QQ", len(header), len(blob)) + header + blob


def unpack(header: bytes, blob: bytes) -> tuple[dict, Any]:
    message = json.loads(header.decode())
    if not isinstance(message, dict):
        raise ValueError("a message is a JSON object")
    arrays = np.load(io.BytesIO(blob), allow_pickle=False) if blob else {}
    return message, arrays


def send(fd: int, message: dict, arrays: list | None = None) -> None:
    data = memoryview(pack(message, arrays))
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def receive(fd: int, timeout: float | None = None) -> tuple[dict, Any]:
    """The next frame from ``fd``: (message, arrays). TimeoutError after ``timeout`` seconds, EOFError when closed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    n_header, n_blob = struct.unpack("<QQ", _read_exactly(fd, 16, deadline))
    if n_header > MAX_FRAME or n_blob > MAX_FRAME:
        raise ValueError("a message larger than the grader accepts")
    return unpack(_read_exactly(fd, n_header, deadline), _read_exactly(fd, n_blob, deadline))


# --------------------------------------------------------------------------- the grading kernel

BLOCKED = "mhalab.labs."  # every submodule: the exercises (references, solutions) and the checkers...
KEPT = tuple(f"mhalab.labs.{name}" for name in ("verdicts", "invoke", "plain"))  # ...but the leaves this file uses


class _Refuse:
    """An import hook: the course's exercise modules cannot be imported in the grading kernel (nor are they in its
    copy of the package)."""

    def find_spec(self, name, path=None, target=None):
        if (name.startswith(BLOCKED) and name not in KEPT) or name in ("labs_fixture",):
            raise ImportError(f"{name} cannot be imported while a notebook is graded: answers are judged elsewhere")
        return None


ANSWERS: dict[str, Any] = {}  # exercise key -> what the learner's cell handed to q.check


def _run_cell(shell, namespace: dict, source: str) -> str | None:
    """Run one cell; the error's class name, or None."""
    if shell is not None:
        result = shell.run_cell(source, store_history=False)
        error = result.error_in_exec or result.error_before_exec
        return None if error is None else type(error).__name__
    try:
        exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 (the learner's own process)
    except BaseException as error:  # noqa: B036
        return type(error).__name__
    return None


def _random_states() -> tuple:
    """Python's, NumPy's and torch's (CPU and CUDA) global random states."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _restore_random_states(states: tuple) -> None:
    python, numpy_state, cpu, cuda = states
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def serve(fd_in: int, fd_out: int, fd_fork: int | None = None) -> None:
    """Answer the grader's requests until it says stop: "run" a cell, "call" an answer; given ``fd_fork`` (a
    socket the grader sends a new submission's two pipe ends over), also "fork" a kernel per submission."""
    import signal

    # The grader stops a cell that runs too long with SIGINT. A process started from a background job
    # inherits SIGINT ignored (POSIX shells do that to `cmd &`), which would make every such cell unstoppable.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.meta_path.insert(0, _Refuse())
    package = os.path.dirname(importlib.import_module("mhalab").__file__)
    skip = tuple(os.path.abspath(p) + os.sep for p in {package, sys.prefix, sys.base_prefix, sys.exec_prefix} if p)
    try:
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        namespace = shell.user_ns
    except ImportError:  # plain Python runs the cells (no magics)
        shell, namespace = None, {"__name__": "__main__"}
    namespace["__name__"] = "__main__"
    send(fd_out, {"ready": True})
    while True:
        try:
            request, arrays = receive(fd_in)
        except (EOFError, OSError):
            return
        op = request.get("op")
        try:
            if op == "fork" and fd_fork is not None:
                from _mhalab_fork import fork  # the prepared kernel's code, beside this file

                pid, channel = fork(request, fd_fork, closing=(fd_in, fd_out, fd_fork))
                if channel is None:
                    send(fd_out, {"pid": pid})
                else:  # this is the new submission's kernel: the same requests, on its own channel
                    (fd_in, fd_out), fd_fork = channel, None
                    send(fd_out, {"ready": True})
            elif op == "run":
                send(fd_out, {"error": _run_cell(shell, namespace, str(request["source"]))})
            elif op == "answers":
                send(fd_out, {"keys": sorted(ANSWERS), "callable": {k: callable(v) for k, v in ANSWERS.items()},
                              "describe": {k: describe(v) for k, v in ANSWERS.items()}})
            elif op == "value":
                out: list = []
                send(fd_out, {"value": encode(ANSWERS.get(request["key"]), out)}, out)
            elif op == "call":
                args = tuple(decode(request["args"], arrays, models=True))
                fn = ANSWERS.get(request["key"])
                states = _random_states()  # judging mid-notebook leaves the later cells the random state they had
                try:
                    kind, value, facts = invoke(fn, args, facts=tuple(request.get("facts", ())),
                                                forbid=tuple(request.get("forbid", ())), package=package)
                finally:
                    _restore_random_states(states)
                out = []
                if kind == "returned":
                    send(fd_out, {"returned": encode(value, out), "facts": facts}, out)
                elif kind == "unbound":
                    send(fd_out, {"unbound": [str(p) for p in value]})
                else:
                    send(fd_out, {"raised": [type(value).__name__, str(value)[:500], where(value, skip)],
                                  "facts": facts})
            elif op == "stop":
                return
            else:
                send(fd_out, {"error": f"unknown request {op!r}"})
        except KeyboardInterrupt:
            send(fd_out, {"raised": ["KeyboardInterrupt", "stopped", ""], "facts": {}})
        except Exception as error:  # what the learner returned could not be sent, and so on
            send(fd_out, {"failed": f"{type(error).__name__}: {error}"[:500]})


#: The resource limits of the grading kernel, and of every process it starts (``resource`` names, values).
LIMITS = ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE")


def _mapped() -> int:
    """Bytes of address space this process maps now (Linux's VmSize; 0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def limit(limits: dict) -> None:
    """Lower this process's soft and hard limits to ``limits`` ({"RLIMIT_AS": bytes, ...}), for good: an
    unprivileged process cannot raise a hard limit, and every process it starts inherits them.

    ``RLIMIT_AS`` is what the learner's code may add to what is mapped now (Python, numpy and torch, loaded by
    then): torch's libraries alone map about 0.6 GB in its CPU build and 3.3 GB in the CUDA build that a plain
    ``pip install torch`` gives on Linux, so one absolute figure would mean a different allowance per build."""
    import resource

    for name, value in limits.items():
        if name in LIMITS and hasattr(resource, name):
            value = int(value) + (_mapped() if name == "RLIMIT_AS" else 0)
            soft, hard = resource.getrlimit(getattr(resource, name))
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(getattr(resource, name), (value, value))


if __name__ == "__main__":
    sys.modules["_mhalab_grading"] = sys.modules[__name__]  # the stub mhalab.labs hands answers to ANSWERS here
    limit(json.loads(os.environ.pop("MHALAB_GRADING_LIMITS", "{}")))
    serve(*[int(fd) for fd in sys.argv[1:4]])
