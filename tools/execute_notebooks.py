"""Run notebooks top to bottom in a fresh kernel and save their outputs in place.

Usage (through the course script, which sets up the environment first):
    python3 course.py execute                      # every notebook
    python3 course.py execute notebooks/04_*.ipynb # some
This is the only way committed outputs are made: never edit an output by hand.
Each notebook runs as a learner's first run does: in an empty working directory of its own (deleted afterwards), so
nothing an earlier run left beside it (notebook 07's checkpoints) is loaded, and nothing is written beside it.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import course_time
import learner_copies
import nbformat


def kernelspec() -> dict:
    """The kernelspec JupyterLab sees for this Python: saved as is, so opening a notebook changes nothing
    (with another display name, JupyterLab rewrites it on open and marks the notebook modified)."""
    from ipykernel.kernelspec import get_kernel_dict

    return {"name": "python3", "display_name": get_kernel_dict()["display_name"], "language": "python"}


#: Each notebook's measured run time, written by every execution: the time model (tools/course_time.py), and so
#: each notebook's Time line, reads it. CPU time (the kernel's, all threads) rather than wall time, which a busy
#: machine inflates.
TIMES = course_time.TIMES


def _kernel_cpu_seconds(client) -> float | None:
    """The kernel process's CPU time so far (user + system, its children included), or None if unreadable."""
    try:
        import psutil  # ipykernel's own dependency

        times = psutil.Process(client.km.provisioner.process.pid).cpu_times()
        return times.user + times.system + times.children_user + times.children_system
    except Exception:  # another provisioner, or a platform psutil cannot read: fall back to wall time
        return None


def execute(path: Path) -> float:
    """Run one notebook in a fresh kernel, save it, record its time; returns the wall time in seconds."""
    from nbclient import NotebookClient  # here: the tests read RUN_TIME and TIMES where nbclient is absent

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    # The kernel's working directory: an empty one, or a checkpoint from an earlier run beside the notebook would
    # be loaded and the outputs would show no training (and too short a run time).
    # (ignore_cleanup_errors: on Windows a kernel still exiting may hold the folder a moment longer)
    with tempfile.TemporaryDirectory(prefix="mhalab-execute-", ignore_cleanup_errors=True) as cwd:
        client = NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": cwd}})
        cpu: dict[str, float | None] = {}
        client.on_notebook_start = lambda notebook: cpu.setdefault("start", _kernel_cpu_seconds(client))
        # after every cell: the kernel is already gone when the notebook-complete hook runs
        client.on_cell_executed = lambda **_: cpu.__setitem__("end", _kernel_cpu_seconds(client))
        client.execute()
    elapsed = time.perf_counter() - start
    if cpu.get("start") is not None and cpu.get("end") is not None:
        seconds = cpu["end"] - cpu["start"]
    else:
        seconds = elapsed
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[path.stem] = round(seconds, 1)
    TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    for cell in nb.cells:  # timing metadata changes on every run: keep diffs to real changes
        cell.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = kernelspec()
    nbformat.write(nb, path)
    return elapsed


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        sys.exit("usage: execute_notebooks.py NOTEBOOK [NOTEBOOK ...]")
    for path in paths:
        print(f"executing {path} ...", flush=True)
        print(f"  done in {execute(path):.1f} s (recorded in {TIMES.name})", flush=True)
    # what follows from the outputs and the run times: each notebook's Time line, the README's total, learn/
    executed = [path.resolve() for path in paths]
    for name in course_time.stale(write=True, paths=executed) + learner_copies.stale(write=True, paths=executed):
        print(f"rewrote {name}", flush=True)
