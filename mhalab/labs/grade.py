"""Grade a learner's notebook: run it, collect the answers, and judge them here (README, "Grading").

The submission runs top to bottom in a fresh kernel, continuing past errors. A last cell added by the
grader calls the learner's answers (each answer cell's check arguments) on the hidden inputs and writes
what they returned, as plain data, to a file; this process reads it with ``torch.load(weights_only=True)``
and judges it with the course's checkers. Nothing the kernel recorded as an outcome counts. The learner's
code runs with your permissions and could fake what is recorded: grade untrusted submissions in a container.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from .core import FAILED, PASSED, STRICT_ENV, exercise, load
from .release import answers

NOT_CHECKED = "not checked"


@dataclass
class ExerciseGrade:
    key: str
    title: str
    points: float
    score: float
    status: str          # passed / failed / error / unanswered / checker error / not checked
    message: str


@dataclass
class GradeReport:
    notebook: str
    notebooks: list[str]
    exercises: list[ExerciseGrade]
    errors: list[str] = field(default_factory=list)   # "cell 5: ValueError", from the executed notebook
    kernel_died: bool = False
    elapsed_s: float = 0.0
    score: float = field(init=False)
    max_score: float = field(init=False)

    def __post_init__(self):
        self.score = sum(e.score for e in self.exercises)
        self.max_score = sum(e.points for e in self.exercises)

    def format(self) -> str:
        width = max([len(e.title) for e in self.exercises] + [10])
        lines = [f"Grade for {self.notebook} (exercises of notebook {', '.join(self.notebooks)}):"]
        for e in self.exercises:
            detail = "" if e.status == PASSED else f"  {e.message}"
            lines.append(f"  {e.key:<6} {e.title:<{width}}  {e.score:g}/{e.points:g}  {e.status}{detail}")
        lines.append(f"  {'total':<6} {'':<{width}}  {self.score:g}/{self.max_score:g}")
        if self.kernel_died:
            lines.append("  The kernel died while running the notebook; exercises after that were not checked.")
        if self.errors:
            lines.append(f"  {len(self.errors)} cell(s) raised errors: " + "; ".join(self.errors[:5]))
        return "\n".join(lines)


def collect(spec: dict[str, tuple[str, list[str]]], namespace: dict, path: str) -> None:
    """Run in the learner's kernel by the grader's last cell: record every answer to ``path``. ``spec`` maps
    an exercise key to its check's arguments as source ("attention", ["explorer"])."""
    import torch

    recorded: dict[str, Any] = {}
    for key, (expression, context) in spec.items():
        try:
            answer = eval(expression, namespace)  # noqa: S307  (the learner's own kernel)
            extra = [eval(c, namespace) for c in context]  # noqa: S307
        except Exception as error:  # e.g. a NameError: the cell stopped before defining it
            recorded[key] = {"problem": f"`{expression}` could not be evaluated after the notebook ran "
                                        f"({type(error).__name__}: {error})"[:300]}
            continue
        try:
            recorded[key] = exercise(*key.split(".")).record(answer, *extra)
        except Exception as error:
            recorded[key] = {"problem": f"recording the answer failed ({type(error).__name__}: {error})"[:300]}
    torch.save(recorded, path)


def execute(nb: Any, *, cwd: str | Path, timeout: float | None = 600, kernel_name: str = "python3") -> tuple[Any, bool]:
    """Run every cell of ``nb`` in place, continuing past errors; return (nb, kernel_died)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True, interrupt_on_timeout=True,
                            record_timing=False, resources={"metadata": {"path": str(cwd)}})
    env = {k: v for k, v in os.environ.items() if k != STRICT_ENV}  # grading never stops at a failed check
    with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):  # the kernel's start-up noise is not the learner's
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except DeadKernelError:
            return nb, True
    return nb, False


def grade(path: str | Path, *, timeout: float | None = 600, kernel_name: str = "python3",
          executed_path: str | Path | None = None) -> GradeReport:
    """Execute the notebook at ``path`` (in its folder) and grade its exercises. ``timeout``: seconds one cell
    may run (None: no limit); ``executed_path``: also save the executed notebook there."""
    import torch

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    cells = [a for a in answers(nb, strict=False) if not a.written]
    ids = sorted({a.key[:2] for a in cells})
    if not ids:
        raise ValueError(f"{path}: no answer cells (cells with nbgrader metadata, grade_id like ex03-1-answer)")
    spec = {a.key: (a.expression, a.context) for a in cells}
    borrowing = {a.key for a in cells if a.borrows}
    with tempfile.TemporaryDirectory(prefix="mhalab-grade-") as tmp:
        out = Path(tmp) / f"answers-{secrets.token_hex(8)}.pt"
        run = nbformat.from_dict(nb)  # a copy: the submission itself is never modified
        run.cells.append(nbformat.v4.new_code_cell(
            "# added by `python -m mhalab.labs grade`: record the answers\n"
            f"__import__('mhalab.labs.grade', fromlist=['collect']).collect({spec!r}, globals(), {str(out)!r})"))
        start = time.perf_counter()
        run, died = execute(run, cwd=path.parent, timeout=timeout, kernel_name=kernel_name)
        elapsed = time.perf_counter() - start
        recorded = torch.load(out, weights_only=True) if out.is_file() else {}
    run.cells.pop()
    grades = []
    for ex in (ex for nb_id in ids for ex in load(nb_id)):  # what counts comes from the course, not the submission
        if ex.key not in spec:
            status, message = NOT_CHECKED, ("the submission has no answer cell for it ending in its check "
                                            "(nbgrader grade_id ex{}-{}-answer)".format(*ex.key.split(".")))
        elif ex.key in borrowing:
            status, message = FAILED, "the answer cell reads the course's own answer (q.reference or q.solution_text)"
        elif ex.key not in recorded:
            status, message = NOT_CHECKED, "the notebook never got to the end, so its answer could not be collected"
        else:
            status, message = ex.replay(recorded[ex.key])
        grades.append(ExerciseGrade(ex.key, ex.title, ex.points, ex.points if status == PASSED else 0, status, message))
    if executed_path is not None:
        nbformat.write(run, executed_path)
    errors = [f"cell {i}: {o.get('ename')}" for i, c in enumerate(run.cells) for o in c.get("outputs", [])
              if o.get("output_type") == "error" and o.get("ename") != "NotImplementedError"]
    return GradeReport(str(path), ids, grades, errors, died, round(elapsed, 1))
