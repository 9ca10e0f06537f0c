"""Test-only exercises for notebook "99", and a small solution notebook that uses them.

Importing this module registers them, in the test process and in the kernels the tests start
(the synthetic notebook puts tests/ on sys.path and imports it). It also finds the course notebooks
that have exercises.
"""

from pathlib import Path

import nbformat
import torch

from mhalab.labs.calls import Check
from mhalab.labs.core import Exercise, register
from mhalab.labs.judging import expect_equal


def _double(x):
    return 2 * x


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _double_cases(check: Check):
    """Fixed cases, and when grading one drawn fresh (as the course's exercises do)."""
    return [(3,), (-7,), (0.5,)] + ([(round(check.rng(1).uniform(-100, 100), 3),)] if check.grading else [])


register(Exercise(
    "99", 1, "double a number", lambda answer, check: check.calls(answer, _double_cases(check)),
    hint="Multiply by two.", solution="def double(x):\n    return 2 * x",
))
register(Exercise(
    "99", 2, "a head count", lambda answer, check: expect_equal(answer, 4, "n_heads"),
    hint=["It is a small power of two.", "Between 2 and 8."], solution="n_heads = 4",
))
register(Exercise(
    "99", 3, "a causal mask of size 5", lambda answer, check: expect_equal(answer, _causal(5), "mask"),
    hint="torch.tril keeps the lower triangle.", solution="mask = torch.ones(5, 5, dtype=torch.bool).tril()",
))


TESTS = Path(__file__).resolve().parent
NOTEBOOKS = TESTS.parent / "notebooks"


def lab_notebooks() -> list[Path]:
    """The course notebooks (notebooks/NN_*.ipynb) that have answer cells, found when collected."""
    return [p for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            if any(c.metadata.get("nbgrader", {}).get("solution") for c in nbformat.read(p, as_version=4).cells)]


def answer_meta(grade_id: str, markdown: bool = False) -> dict:
    meta = {"grade": markdown, "grade_id": grade_id, "locked": False, "schema_version": 3, "solution": True}
    return {**meta, "points": 0} if markdown else meta


def synthetic_notebook(
    *, answers: dict[str, str] | None = None, extra: dict[int, str] | None = None
) -> nbformat.NotebookNode:
    """A small solution notebook with the course's exercise layout (exercises of notebook "99").

    ``answers`` replaces solution bodies ({"double": "return x + 2"}); ``extra`` inserts code cells
    before the given cell index.
    """
    answers = {
        "double": "return 2 * x",
        "n_heads": "n_heads = 4",
        "mask": "mask = torch.ones(5, 5, dtype=torch.bool).tril()",
        **(answers or {}),
    }
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# Notebook 99: a fixture"),
        v4.new_code_cell("import torch\nx = 21\nprint('twice x is', 2 * x)"),
        v4.new_markdown_cell("## Exercises"),
        v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\ntry:\n    import labs_fixture  # registers "
                         "notebook 99's exercises\n"
                         "except ImportError:  # a grading kernel refuses it (the grader judges there)\n    pass\n"
                         "from mhalab import labs\n\nq1, q2, q3 = labs.load(\"99\")"),
        v4.new_code_cell("def double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    "
                         f"{answers['double']}\n    ### END SOLUTION\n\nq1.check(double)"),
        v4.new_code_cell(f"### BEGIN SOLUTION\n{answers['n_heads']}\n### END SOLUTION\nq2.check(n_heads)"),
        v4.new_markdown_cell("Why is that a good choice?\n\n### BEGIN SOLUTION\nBecause the width divides evenly.\n### "
                             "END SOLUTION"),
        v4.new_code_cell(f"### BEGIN SOLUTION\n{answers['mask']}\n### END SOLUTION\nq3.check(mask)"),
    ]
    for index, grade_id in ((4, "ex99-1-answer"), (5, "ex99-2-answer"), (6, "ex99-2-written"), (7, "ex99-3-answer")):
        cells[index].metadata["nbgrader"] = answer_meta(grade_id, cells[index].cell_type == "markdown")
    for index in sorted(extra or {}, reverse=True):
        cells.insert(index, v4.new_code_cell(extra[index]))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


# A class of submissions in nbgrader's layout, each kind with the total it must get (tests/test_labs_class.py,
# benchmarks/grading.py). The first code cell of each answer is replaced; see synthetic_notebook for the rest.
CRASH = "import os\nos._exit(3)"
ENDLESS = "while True:\n    pass"
STUBBORN = "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass"
FORGED = ("import mhalab.labs as L\nL.Exercise.check = lambda self, answer: None   # later checks hand in nothing\n"
          "import _mhalab_grading\n_mhalab_grading.ANSWERS.update({'99.1': 'passed', '99.2': 'passed'})\n")
CLASS_KINDS = {  # kind: (how the submission is made, the total it must get, how many of them)
    "correct": (lambda: synthetic_notebook(), 3, 8),
    "partly_wrong": (lambda: synthetic_notebook(answers={"double": "return x + 2"}), 2, 5),
    "all_wrong": (
        lambda: synthetic_notebook(
            answers={
                "double": "return x",
                "n_heads": "n_heads = 3",
                "mask": "mask = torch.ones(5, 5, dtype=torch.bool)",
            }
        ),
        0,
        3,
    ),
    "raising": (lambda: synthetic_notebook(answers={"double": "return x.nope"}), 2, 2),
    "crashing": (
        lambda: _prepend(synthetic_notebook(), 5, CRASH),
        1,
        3,
    ),  # the kernel dies in 99.2: 99.1 keeps its point
    "endless": (lambda: _prepend(synthetic_notebook(), 4, ENDLESS), 2, 3),  # interrupted: 99.1 never handed in
    "stubborn": (lambda: _prepend(synthetic_notebook(), 7, STUBBORN), 2, 2),  # ignores the interrupt: killed in 99.3
    "forged": (lambda: _prepend(synthetic_notebook(), 4, FORGED), 0, 3),
    "relabelled": (lambda: _relabel(synthetic_notebook(), "ex01"), 0, 3),
    "not_a_notebook": (lambda: "this is not JSON", 0, 1),
}


def _prepend(nb, index, source):
    """``source`` at the top of answer cell ``index`` (4: 99.1, 5: 99.2, 7: 99.3)."""
    nb.cells[index].source = source + "\n" + nb.cells[index].source
    return nb


def _relabel(nb, prefix):
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if meta:
            meta["grade_id"] = meta["grade_id"].replace("ex99", prefix)
    return nb


def build_class(folder: Path, kinds: dict = CLASS_KINDS) -> dict[str, int]:
    """Write ``folder/submitted/<student>/99/99_fixture.ipynb`` for every kind; {student: expected total}."""
    expected = {}
    for kind, (make, total, count) in kinds.items():
        for i in range(count):
            student = f"{kind}_{i}"
            path = folder / "submitted" / student / "99" / "99_fixture.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nb = make()
            path.write_text(nb) if isinstance(nb, str) else nbformat.write(nb, path)
            expected[student] = total
    return expected
