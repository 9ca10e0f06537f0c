"""Test-only exercises for notebook "99", used by tests/test_labs.py's synthetic notebooks.

Importing this module registers them, in the test process and in the kernels the tests start
(the synthetic notebooks put tests/ on sys.path and import it). It also builds that synthetic
notebook and finds the course notebooks that have exercises.
"""

from pathlib import Path

import nbformat
import torch

from mhalab.labs.checks import call_on_hidden_cases, case, expect_equal
from mhalab.labs.core import Exercise, register


def _double(x):
    return 2 * x


def _check_double(answer):
    call_on_hidden_cases(answer, [case(3), case(-7), case(0.5)], _double, name="double")


def _check_count(answer):
    expect_equal(answer, 4, "n_heads")


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _check_mask(answer):
    expect_equal(answer, _causal(5), "mask")


register(Exercise(
    "99", 1, "double a number", _check_double,
    hint="Multiply by two.", solution="def double(x):\n    return 2 * x",
    reference=_double, wrong=[lambda x: x + 2, lambda x: x * x],
))
register(Exercise(
    "99", 2, "a head count", _check_count,
    hint=["It is a small power of two.", "Between 2 and 8."], solution="n_heads = 4",
    reference=4, wrong=[8, 4.5, "4"],
))
register(Exercise(
    "99", 3, "a causal mask of size 5", _check_mask,
    hint="torch.tril keeps the lower triangle.", solution="mask = torch.ones(5, 5, dtype=torch.bool).tril()",
    reference=_causal(5), wrong=[_causal(5).T, _causal(5).float(), ~_causal(5)],
))


# ------------------------------------------------------------------------------------ notebooks

TESTS = Path(__file__).resolve().parent
NOTEBOOKS = TESTS.parent / "notebooks"


def lab_notebooks() -> list[Path]:
    """The course notebooks (notebooks/NN_*.ipynb) that have solution regions, found when collected."""
    found = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if any("BEGIN SOLUTION" in c.source for c in nb.cells):
            found.append(path)
    return found


def synthetic_notebook(*, answers: dict[str, str] | None = None, extra: dict[int, str] | None = None) -> nbformat.NotebookNode:
    """A small solution notebook with the course's exercise layout (exercises of notebook "99").

    ``answers`` replaces solution bodies ({"double": "return x + 2"}); ``extra`` inserts code cells
    before the given cell index.
    """
    answers = {"double": "return 2 * x", "n_heads": "n_heads = 4", "mask": "mask = torch.ones(5, 5, dtype=torch.bool).tril()", **(answers or {})}
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# Notebook 99: a fixture"),
        v4.new_code_cell("import torch\nx = 21\nprint('twice x is', 2 * x)"),
        v4.new_markdown_cell("## Exercises"),
        v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport labs_fixture\nfrom mhalab import labs\n\nq1, q2, q3 = labs.load(\"99\")"),
        v4.new_code_cell(f"def double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    {answers['double']}\n    ### END SOLUTION\n\nq1.check(double)"),
        v4.new_code_cell(f"### BEGIN SOLUTION\n{answers['n_heads']}\n### END SOLUTION\nq2.check(n_heads)"),
        v4.new_markdown_cell("Why is that a good choice?\n\n### BEGIN SOLUTION\nBecause the width divides evenly.\n### END SOLUTION"),
        v4.new_code_cell(f"mask = None\n### BEGIN SOLUTION\n{answers['mask']}\n### END SOLUTION"),
        v4.new_code_cell("q3.check(mask)"),
    ]
    for index in sorted(extra or {}, reverse=True):
        cells.insert(index, v4.new_code_cell(extra[index]))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb

