"""What `python3 course.py lab` installs before JupyterLab opens, on a clean clone: time, bytes fetched, size on disk,
and whether CUDA wheels or test tools came along.

    python3 benchmarks/install_size.py CLONE [LABEL]

runs CLONE's own set-up (course.py's ensure_environment with the extras `lab` installs) into CLONE/.venv with an
empty pip cache, from pip's own output counts the bytes of every wheel it downloaded ("Downloading x.whl (6.8 MB)")
or took from a local file ("Processing /path/x.whl": here a local mirror stands in for PyPI), and prints one JSON
line. Set MHALAB_TORCH_CPU_INDEX to a
local PEP 503 folder (file:///...) to stand in for PyTorch's CPU index where it cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


def fetched(log: str) -> dict[str, float]:
    """{wheel: bytes} of every wheel pip's output says it downloaded or took from a local file."""
    sizes = {name: float(n) * UNITS[u]
             for name, n, u in re.findall(r"Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)", log)}
    for path in set(re.findall(r"Processing (/\S+\.whl)", log)):
        if Path(path).exists():
            sizes[Path(path).name] = Path(path).stat().st_size
    return sizes


def main(clone: Path, label: str) -> dict:
    env = dict(os.environ, MHALAB_VENV=str(clone / ".venv"), PIP_CACHE_DIR=tempfile.mkdtemp(prefix="pipcache-"),
               PYTHONUNBUFFERED="1")
    code = "import course; course.ensure_environment()"  # what `lab` does before it opens JupyterLab
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(run.stdout[-3000:] + run.stderr[-3000:])
    sizes = fetched(run.stdout + run.stderr)
    listed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    du = subprocess.run(["du", "-sb", str(clone / ".venv")], capture_output=True, text=True).stdout.split()[0]
    return {
        "label": label, "seconds": round(seconds), "fetched_MB": round(sum(sizes.values()) / 1e6),
        "largest_MB": {name: round(size / 1e6) for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:6]},
        "venv_MB": round(int(du) / 1e6), "packages": len(names),
        "cuda_wheels": sorted(n for n in names if n.startswith("nvidia-")),
        "test_tools": sorted(names & {"pytest", "nbval", "hypothesis", "pytest-xdist", "playwright", "ruff",
                                      "mhalab-grader"}),
    }


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    print(json.dumps(main(Path(sys.argv[1]).resolve(), sys.argv[2] if len(sys.argv) == 3 else "")))
