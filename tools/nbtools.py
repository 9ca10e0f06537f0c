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


def colab_cell_source(url: str | None = None) -> str:
    """The first code cell of every notebook: installs mhalab on Colab, does nothing elsewhere."""
    url = url or repository_url()
    return (
        f"{COLAB_MARKER}: on Colab, install mhalab from the course repository; elsewhere this does nothing.\n"
        "import sys\n"
        "if \"google.colab\" in sys.modules:\n"
        f"    %pip install -q \"mhalab @ git+{url}\""
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
