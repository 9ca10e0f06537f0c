"""The grading kernel's side of grading, and the plain data that passes between it and the grader.

``python worker.py FD_IN FD_OUT`` runs a notebook's cells as the grader sends them, then calls the
learner's answers on the inputs the grader sends and sends back what they returned. It is copied out of
the package for the grading kernel (beside ``_mhalab_invoke.py``, a copy of :mod:`mhalab.labs.invoke`) and
imports nothing of ``mhalab.labs``: that kernel gets a stub ``mhalab.labs`` (``q.check(answer)`` only notes
the answer) and an import hook that refuses the rest. Before any of the learner's code runs it lowers its own
resource limits (:func:`limit`), which nothing it starts can raise again.

Everything that crosses is JSON plus an ``.npz`` of arrays (``allow_pickle=False``): no code is loaded on
either side, over two pipes the grader opened (no socket, so the kernel needs no network at all).
"""

from __future__ import annotations

import dataclasses
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

try:  # in the grading kernel: the copy beside this file (mhalab.labs cannot be imported there)
    from _mhalab_invoke import Opaque, describe, invoke, where
except ImportError:  # in the grader
    from mhalab.labs.invoke import Opaque, describe, invoke, where

MAX_FRAME = 1 << 30  # bytes one message may take (a learner's answer could return anything)

# --------------------------------------------------------------------------- plain data


def encode(value: Any, arrays: list, depth: int = 0) -> Any:
    """``value`` as JSON-able data; tensors and arrays go to ``arrays`` (numbered). Models of ``mhalab.models``
    travel as their class, config and weights, mhalab's dataclasses (configs) as their class and fields;
    anything else unknown as its description."""
    if isinstance(value, np.generic):  # np.float64 and np.str_ are a float and a str
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        big = isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**62
        return {"__int__": str(value)} if big else value
    if isinstance(value, float):
        return value if np.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16 or t.is_complex() and t.dtype == torch.complex32:
            t = t.float()
        arrays.append(t.resolve_conj().resolve_neg().contiguous().numpy())
        return {"__tensor__": len(arrays) - 1, "dtype": dtype}
    if isinstance(value, np.ndarray) and value.dtype != object:
        arrays.append(np.ascontiguousarray(value))
        return {"__ndarray__": len(arrays) - 1}
    if depth < 8 and isinstance(value, (tuple, list)):  # torch.Size and named tuples become tuples
        items = [encode(v, arrays, depth + 1) for v in value]
        return items if isinstance(value, list) else {"__tuple__": items}
    if depth < 8 and type(value) is dict:
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, arrays, depth + 1) for k, v in value.items()}
        return {"__dict__": [[encode(k, arrays, depth + 1), encode(v, arrays, depth + 1)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and _travels(type(value).__module__):
        # a config of mhalab's (a model's sizes): its class and its fields, rebuilt in the grading kernel
        return {"__config__": f"{type(value).__module__}:{type(value).__qualname__}",
                "fields": encode({f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}, arrays,
                                 depth + 1)}
    config = getattr(value, "config", None)
    if (isinstance(value, torch.nn.Module) and type(value).__module__.startswith("mhalab.")
            and dataclasses.is_dataclass(config)):
        return {"__model__": f"{type(value).__module__}:{type(value).__qualname__}",
                "config_class": f"{type(config).__module__}:{type(config).__qualname__}",
                "config": encode(dataclasses.asdict(config), arrays, depth + 1),
                "state": encode(dict(value.state_dict()), arrays, depth + 1), "training": value.training}
    return {"__opaque__": describe(value)}


def _travels(module: str) -> bool:
    return module.startswith("mhalab.") and not module.startswith("mhalab.labs")


def _mhalab_class(path: str):
    module, _, name = str(path).partition(":")
    if not module.startswith("mhalab.") or module.startswith("mhalab.labs"):
        raise ValueError(f"refusing to build {path!r}: only models of mhalab travel")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def decode(value: Any, arrays: Any, *, models: bool = False) -> Any:
    """The inverse of :func:`encode`. Tensors come back as tensors, arrays as arrays, other objects as
    :class:`Opaque`; a model or config is rebuilt only with ``models=True`` (the grading kernel, from the grader)."""
    if isinstance(value, list):
        return [decode(v, arrays, models=models) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        t = torch.from_numpy(np.array(arrays[f"a{int(value['__tensor__'])}"]))
        dtype = getattr(torch, str(value.get("dtype")), None)
        return t.to(dtype) if isinstance(dtype, torch.dtype) and dtype != t.dtype else t
    if "__ndarray__" in value:
        return np.array(arrays[f"a{int(value['__ndarray__'])}"])
    if "__tuple__" in value:
        return tuple(decode(v, arrays, models=models) for v in value["__tuple__"])
    if "__dict__" in value:
        return {_hashable(decode(k, arrays, models=models)): decode(v, arrays, models=models)
                for k, v in value["__dict__"]}
    if "__int__" in value:
        return int(value["__int__"])
    if "__float__" in value:
        return float(value["__float__"])
    if "__opaque__" in value:
        return Opaque(value["__opaque__"])
    if "__config__" in value:
        if not models:
            return Opaque("a config")
        return _mhalab_class(value["__config__"])(**decode(value["fields"], arrays))
    if "__model__" in value:
        if not models:
            return Opaque("a model")
        config = _mhalab_class(value["config_class"])(**decode(value["config"], arrays))
        model = _mhalab_class(value["__model__"])(config)
        model.load_state_dict(decode(value["state"], arrays))
        return model.train(bool(value.get("training")))
    return {k: decode(v, arrays, models=models) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, tuple)):
        return tuple(_hashable(k) for k in key)
    return repr(key) if isinstance(key, (dict, Opaque)) else key


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

BLOCKED = "mhalab.labs."  # every submodule: the exercises (references, solutions) and the checkers


class _Refuse:
    """An import hook: the course's exercise modules cannot be imported in the grading kernel."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith(BLOCKED) or name in ("labs_fixture",):
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
