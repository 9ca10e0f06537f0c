"""The learner copies (learn/, tools/learner_copies.py): what a learner opens holds no solution, is exactly what
the instructors' release makes of its notebook, and runs to its end with nothing answered."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import learner_copies  # noqa: E402

import mhalab.labs as labs  # noqa: E402

COPIES = sorted(learner_copies.LEARN.glob("[0-9][0-9]_*.ipynb"))


def test_every_notebook_has_its_current_learner_copy():
    assert learner_copies.stale() == [], "run `python3 course.py execute` (or `python tools/learner_copies.py --write`)"
    assert [p.name for p in COPIES] == [p.name for p in sorted(learner_copies.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]


def _pairs(text: str) -> set[tuple[str, str]]:
    """Consecutive pairs of a text's non-blank lines, stripped: two lines of a solution in a row are its own (one
    line, like ``d_k = W_Q.size(1) // n_heads``, may well be the lesson's too)."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    return set(zip(lines, lines[1:]))


@pytest.mark.parametrize("path", COPIES, ids=[p.stem for p in COPIES])
def test_a_learner_copy_holds_no_solution(path):
    nb = nbformat.read(path, as_version=4)
    texts = [c.source for c in nb.cells] + [str(o.get("text", o.get("data", ""))) for c in nb.cells
                                            for o in c.get("outputs", [])]
    assert not any("BEGIN SOLUTION" in t or "✓ Exercise" in t for t in texts)
    number = path.name[:2]
    for ex in labs.load(number) if number in labs.available_notebooks() else ():
        body = "\n".join(ex.solution_text.split("\n")[1:])  # the def line is the template, given to the learner
        leaked = [pair for t in texts for pair in _pairs(t) & _pairs(body)]
        assert not leaked, f"{path.name} shows lines of the solution of {ex.key}: {leaked}"


@pytest.mark.slow
@pytest.mark.parametrize("path", COPIES, ids=[p.stem for p in COPIES])
def test_run_all_on_a_learner_copy_with_nothing_answered_runs_to_its_end(path, tmp_path, monkeypatch):
    """Each check says "not answered yet" and the run goes on; the cells after an exercise say they use the
    course's answer (q.use) instead of raising."""
    from nbclient import NotebookClient

    monkeypatch.delenv("MHALAB_LABS_STRICT", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {i: "".join(o.get("text", "") for o in c.outputs)
               for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    number = path.name[:2]
    exercises = labs.load(number) if number in labs.available_notebooks() else ()
    said = "\n".join(outputs.values())
    for ex in exercises:
        assert f"○ Exercise {ex.key} ({ex.title}): not answered yet" in said
    used = [line for line in said.split("\n") if "the cells below use the course's answer" in line]
    uses = sum(c.source.count(".use(") for c in nb.cells if c.cell_type == "code")
    assert len(used) == uses
