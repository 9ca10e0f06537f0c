"""Helpers for checking the course notebooks (not part of the package).

The notebooks themselves (``notebooks/NN_topic.ipynb``) are the source of truth; these helpers
list them and keep their first cell the current Colab set-up cell.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COLAB_MARKER = "# Colab set-up"


def repository_url() -> str:
    """The course repository, read from pyproject.toml ([project.urls] Repository)."""
    match = re.search(r'(?m)^Repository = "(.*)"$', (ROOT / "pyproject.toml").read_text())
    if not match:
        raise RuntimeError("pyproject.toml has no `Repository = \"...\"` line under [project.urls]")
    return match.group(1)


#: Set to what pip should install (``git+file:///path/to/clone``, a wheel's path) to make
#: the Colab cell install from there, also off Colab: how tests simulate Colab without the network.
SOURCE_VARIABLE = "MHALAB_SOURCE"
#: Where the cell writes its pip constraints (every package already installed, at its installed version).
KEEP_FILE = "/tmp/mhalab-keep-installed.txt"


def colab_cell_source(url: str | None = None) -> str:
    """The first code cell of every notebook: installs mhalab on Colab, does nothing elsewhere.

    It never replaces what Colab already has (torch, numpy, matplotlib, ipywidgets, tqdm and the rest):
    every installed package goes into a pip constraints file at its installed version, so pip can only
    add what is missing (usually mhalab alone). If an installed package were older than mhalab needs,
    pip would stop with a conflict instead of upgrading it under the running kernel."""
    url = url or repository_url()
    return (
        f"{COLAB_MARKER}: on Colab, install mhalab from the course repository; elsewhere this does nothing.\n"
        "# Only what is missing is added: the torch, numpy, matplotlib, ipywidgets and tqdm there are kept "
        "as they are.\n"
        "import os\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        f"if \"google.colab\" in sys.modules or \"{SOURCE_VARIABLE}\" in os.environ:\n"
        f"    source = os.environ.get(\"{SOURCE_VARIABLE}\", \"git+{url}\")\n"
        "    pip_list = [sys.executable, \"-m\", \"pip\", \"list\", \"--format=freeze\"]\n"
        "    installed = subprocess.run(pip_list, capture_output=True, text=True).stdout\n"
        f"    with open(\"{KEEP_FILE}\", \"w\") as keep:  # pip constraints: each installed version stays\n"
        "        keep.write(\"\\n\".join(line for line in installed.splitlines() "
        "if not line.lower().startswith(\"mhalab==\")))\n"
        f"    %pip install -q -c {KEEP_FILE} \"$source\"\n"
        "    import mhalab  # noqa: F401 (unused here: a failed install stops at this line, not at a later cell)"
    )


def course_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def colab_cell_problems(write: bool = False) -> list[str]:
    """Notebooks whose first code cell is not the current Colab set-up cell (rewritten when ``write``)."""
    expected = colab_cell_source()
    problems = []
    for path in course_notebooks():
        nb = nbformat.read(path, as_version=4)
        first = next((c for c in nb.cells if c.cell_type == "code"), None)
        if first is not None and first.source == expected:
            continue
        problems.append(path.name)
        if write:
            if first is not None and first.source.startswith(COLAB_MARKER):
                first.source = expected
            else:
                nb.cells.insert(0, nbformat.v4.new_code_cell(expected))
            nbformat.write(nb, path)
    return problems
