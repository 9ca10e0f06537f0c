"""Run notebooks top to bottom in a fresh kernel and save their outputs in place.

Usage (through the course script, which sets up the environment first):
    python3 course.py execute                      # every notebook
    python3 course.py execute notebooks/03_*.ipynb # some
This is the only way committed outputs are made: never edit an output by hand.
"""

import json
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def kernelspec() -> dict:
    """The kernelspec JupyterLab sees for this Python: saved as is, so opening a notebook changes nothing
    (with another display name, JupyterLab rewrites it on open and marks the notebook modified)."""
    from ipykernel.kernelspec import get_kernel_dict

    return {"name": "python3", "display_name": get_kernel_dict()["display_name"], "language": "python"}


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:  # timing metadata changes on every run: keep diffs to real changes
        cell.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = kernelspec()
    nbformat.write(nb, path)
    return elapsed


TIMES = Path(__file__).resolve().parent.parent / "website" / "notebook_times.json"  # the instructors' page shows them


def record_time(path: Path, seconds: float, times_file: Path = TIMES) -> None:
    """Note ``path``'s execution time (seconds) in ``times_file``, keeping the other notebooks' times."""
    times = json.loads(times_file.read_text()) if times_file.exists() else {}
    times[path.name] = round(seconds, 1)
    times_file.write_text(json.dumps(dict(sorted(times.items())), indent=2) + "\n")


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        sys.exit("usage: execute_notebooks.py NOTEBOOK [NOTEBOOK ...]")
    for path in paths:
        print(f"executing {path} ...", flush=True)
        seconds = execute(path)
        record_time(path, seconds)
        print(f"  done in {seconds:.1f} s", flush=True)
