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
COLAB_NOTE = "# Colab only: installs mhalab"
LEARNER_COPIES = ROOT / "learn"


def reads_pretrained_models(nb) -> bool:
    """Whether a notebook loads one of the real pretrained models (its Colab cell then installs them)."""
    return any(c.cell_type == "code" and "mhalab.pretrained" in c.source for c in nb.cells)


def colab_cell_source(url: str | None = None, models: bool = False) -> str:
    """The first code cell of every notebook: installs mhalab on Colab, does nothing elsewhere.

    mhalab itself goes in without its dependencies; then :func:`mhalab.install.install_missing` adds what it
    needs that Colab lacks, holding everything Colab has at its version (the one place that logic lives)."""
    url = url or repository_url()
    return (
        f"{COLAB_NOTE}{' and the two pretrained models' if models else ''} (about a minute); "
        "elsewhere this does nothing.\n"
        "import os\n"
        "import sys\n"
        "\n"
        f"if \"google.colab\" in sys.modules or \"{SOURCE_VARIABLE}\" in os.environ:\n"
        f"    source = os.environ.get(\"{SOURCE_VARIABLE}\", \"git+{url}\")\n"
        "    %pip install -q --no-deps \"$source\"\n"
        "    from mhalab.install import install_missing\n"
        f"    install_missing(models={models})  # only what is missing: what Colab has stays as it is"
    )


def colab_url(path: Path, url: str | None = None) -> str:
    """Where Colab opens a notebook's learner copy straight from the course repository on GitHub."""
    url = url or repository_url()
    github = re.match(r"^https://github\.com/([^/\s]+)/([^/\s]+?)(?:\.git)?/?$", url)
    if not github:
        raise ValueError(f"Colab opens notebooks from GitHub; the repository {url!r} is not a github.com URL")
    return f"https://colab.research.google.com/github/{github[1]}/{github[2]}/blob/main/learn/{path.name}"


def colab_badge(path: Path, url: str | None = None) -> str:
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path, url)})"


def course_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def colab_cell_problems(write: bool = False, paths: list[Path] | None = None) -> list[str]:
    """Notebooks whose first code cell is not the current Colab set-up cell, or whose first cell does not end its
    title line with the Colab badge (both rewritten when ``write``). A second install cell (the models', before
    the Colab cell installed them) is removed."""
    problems = []
    for path in paths or course_notebooks():
        nb = nbformat.read(path, as_version=4)
        expected = colab_cell_source(models=reads_pretrained_models(nb))
        code = [c for c in nb.cells if c.cell_type == "code"]
        first = code[0] if code else None
        stale = [c for c in code[1:] if "google.colab" in c.source and "%pip" in c.source]
        title, _, rest = nb.cells[0].source.partition("\n")
        badge = colab_badge(path)
        if first is not None and first.source == expected and not stale and title.endswith(badge):
            continue
        problems.append(path.name)
        if write:
            if first is not None and first.source.startswith(("# Colab", COLAB_NOTE)):
                first.source = expected
            else:
                nb.cells.insert(1, nbformat.v4.new_code_cell(expected))
            nb.cells = [c for c in nb.cells if not any(c is s for s in stale)]
            title = re.sub(r" ?\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)$", "", title)
            nb.cells[0].source = f"{title} {badge}\n{rest}"
            nbformat.write(nb, path)
    return problems
