"""Grade a learner's notebook: run it, then read which exercise checks passed.

``python -m mhalab.labs grade SUBMISSION.ipynb [--json out.json] [--timeout S]``

The notebook is executed top to bottom in a fresh kernel with nbclient, continuing past errors
(an unanswered exercise raises ``NotImplementedError``; a cell that runs longer than the timeout is
interrupted). A last cell, added by the grader, prints what every ``check`` recorded in that kernel
(:func:`mhalab.labs.outcomes`). If the kernel dies before that, the ``✓``/``✗`` lines the checks
printed are read from the outputs instead. The exercises a notebook should have come from the
registry (``labs.load("NN")`` for the notebook's number), so an exercise whose check never ran
scores 0 ("not checked").

The grade is as trustworthy as the learner's kernel: it runs the learner's code, which could tamper
with the recorded outcomes. For high-stakes grading, run it in a sandbox and compare the check
cells with the released version (nbgrader's locked cells do the latter).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .core import ERROR, FAILED, PASSED, STRICT_ENV, UNANSWERED, load
from .release import _source, bindings, checks_in, notebook_ids

NOT_CHECKED = "not checked"
RESULTS_TAG = "MHALAB-LABS-OUTCOMES "
_RESULTS_CELL = (
    "# added by `python -m mhalab.labs grade`: report what every exercise check recorded\n"
    f"print({RESULTS_TAG!r} + __import__('json').dumps(__import__('mhalab.labs.core', fromlist=['outcomes']).outcomes()))"
)
_PRINTED = re.compile(r"^(?P<mark>[✓✗]) Exercise (?P<key>\d+\.\d+) \(.*?\): (?P<message>.*)$", re.M)


@dataclass
class ExerciseGrade:
    key: str
    title: str
    points: float
    score: float
    status: str          # passed / failed / error / unanswered / not checked
    message: str


@dataclass
class CellError:
    cell: int
    ename: str
    evalue: str


@dataclass
class GradeReport:
    notebook: str
    notebooks: list[str]
    exercises: list[ExerciseGrade]
    errors: list[CellError] = field(default_factory=list)
    kernel_died: bool = False
    outcomes_from: str = "kernel"   # "kernel" (the grader's last cell) or "outputs" (printed lines)
    elapsed_s: float = 0.0

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.points for e in self.exercises)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(score=self.score, max_score=self.max_score)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def format(self) -> str:
        width = max([len(e.title) for e in self.exercises] + [10])
        lines = [f"Grade for {self.notebook} (exercises of notebook {', '.join(self.notebooks)}):"]
        for e in self.exercises:
            detail = "" if e.status == PASSED else f"  {e.message}"
            lines.append(f"  {e.key:<6} {e.title:<{width}}  {_fmt(e.score)}/{_fmt(e.points)}  {e.status}{detail}")
        lines.append(f"  {'total':<6} {'':<{width}}  {_fmt(self.score)}/{_fmt(self.max_score)}")
        if self.kernel_died:
            lines.append("  The kernel died while running the notebook; later cells did not run (outcomes read from printed outputs).")
        others = [e for e in self.errors if e.ename != "NotImplementedError"]
        if others:
            lines.append(f"  {len(others)} cell(s) raised errors: " + "; ".join(f"cell {e.cell}: {e.ename}" for e in others[:5]))
        return "\n".join(lines)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _status_from_message(mark: str, message: str) -> str:
    if mark == "✓":
        return PASSED
    if message.startswith("no answer yet"):
        return UNANSWERED
    if " raised " in message.split(":", 1)[0] + ":" or message.startswith("your answer raised"):
        return ERROR
    return FAILED


def printed_outcomes(nb: Any) -> dict[str, dict[str, Any]]:
    """Outcomes read from the ✓/✗ lines the checks printed (the last one per exercise wins)."""
    found: dict[str, dict[str, Any]] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                text = output.get("text", "")
                text = "".join(text) if isinstance(text, list) else text
                for m in _PRINTED.finditer(text):
                    status = _status_from_message(m.group("mark"), m.group("message"))
                    found[m.group("key")] = {"passed": status == PASSED, "status": status, "message": m.group("message")}
    return found


def cell_errors(nb: Any) -> list[CellError]:
    """Every error output of an executed notebook: (cell index, exception name, message)."""
    errors = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(CellError(index, output.get("ename", "?"), str(output.get("evalue", ""))[:500]))
    return errors


def _unanswered_keys(nb: Any, errors: list[CellError]) -> set[str]:
    """Exercises whose cells stopped at the NotImplementedError placeholder before their check ran."""
    bound = bindings(nb)
    next_check: dict[int, str | None] = {}
    upcoming: str | None = None
    for index in range(len(nb.cells) - 1, -1, -1):
        cell = nb.cells[index]
        if cell.cell_type == "code":
            hits = checks_in(_source(cell), bound)
            if hits:
                upcoming = hits[0][1]
        next_check[index] = upcoming
    return {next_check[e.cell] for e in errors if e.ename == "NotImplementedError" and next_check.get(e.cell)}


def execute(nb: Any, *, cwd: str | Path, timeout: float | None = 600, kernel_name: str = "python3") -> tuple[Any, bool]:
    """Run every cell of ``nb`` in place, continuing past errors; return (nb, kernel_died)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        allow_errors=True,
        interrupt_on_timeout=True,    # a cell that runs too long is interrupted, and grading goes on
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    died = False
    env = {k: v for k, v in os.environ.items() if k != STRICT_ENV}  # grading records outcomes; it never stops on one
    # The kernel's own stderr (start-up warnings) is not the learner's output: keep it off the report.
    with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):
        try:
            info = client.wait_for_reply(client.kc.kernel_info())
            if info and "language_info" in info.get("content", {}):
                nb.metadata["language_info"] = info["content"]["language_info"]
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except DeadKernelError:
            died = True
    return nb, died


def results_cell() -> Any:
    """The cell the grader appends: it prints every recorded outcome as one JSON line."""
    import nbformat

    return nbformat.v4.new_code_cell(_RESULTS_CELL)


def read_results(cell: Any) -> dict[str, dict[str, Any]] | None:
    """The outcomes a :func:`results_cell` printed (None if it did not run or was tampered with)."""
    for output in cell.get("outputs", []):
        text = output.get("text", "") if output.get("output_type") == "stream" else ""
        text = "".join(text) if isinstance(text, list) else text
        if RESULTS_TAG in text:
            try:
                found = json.loads(text.split(RESULTS_TAG, 1)[1].strip().split("\n", 1)[0])
            except json.JSONDecodeError:
                return None
            return found if isinstance(found, dict) else None
    return None


def score(executed: Any, expected: list, recorded: dict[str, dict[str, Any]]) -> list[ExerciseGrade]:
    """One grade per expected exercise, from the recorded outcomes and the executed notebook's errors."""
    unanswered = _unanswered_keys(executed, cell_errors(executed))
    grades = []
    for ex in expected:
        outcome = recorded.get(ex.key)
        if isinstance(outcome, dict):
            status = outcome.get("status", PASSED if outcome.get("passed") else FAILED)
            message = str(outcome.get("message", ""))
        elif ex.key in unanswered:
            status, message = UNANSWERED, "no answer yet: the NotImplementedError placeholder is still there"
        else:
            status, message = NOT_CHECKED, "its check never ran (no cell called it, or an earlier error stopped it)"
        grades.append(ExerciseGrade(ex.key, ex.title, ex.points, ex.points if status == PASSED else 0, status, message))
    return grades


def grade(
    path: str | Path,
    *,
    timeout: float | None = 600,
    kernel_name: str = "python3",
    notebook: str | None = None,
    cwd: str | Path | None = None,
    executed_path: str | Path | None = None,
) -> GradeReport:
    """Execute the notebook at ``path`` and grade its exercises.

    Args:
        timeout: seconds one cell may run before it is interrupted (None: no limit).
        notebook: whose exercises to expect ("03"); by default read from the notebook's
            ``labs.load("NN")`` calls, else its file name.
        cwd: where the kernel runs (default: the notebook's folder).
        executed_path: also save the executed notebook there (feedback for the learner).
    """
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    ids = [str(notebook).zfill(2)] if notebook else notebook_ids(nb, path)
    if not ids:
        raise ValueError(f"{path}: cannot tell which notebook's exercises it has; pass notebook='NN' (--notebook NN)")
    expected = [ex for nb_id in ids for ex in load(nb_id)]
    if not expected:
        raise ValueError(f"{path}: notebook(s) {ids} have no registered exercises")

    run = nbformat.from_dict(nb)  # a copy: the submission itself is never modified
    run.cells.append(results_cell())
    start = time.perf_counter()
    run, died = execute(run, cwd=cwd or path.parent, timeout=timeout, kernel_name=kernel_name)
    elapsed = time.perf_counter() - start
    recorded, source = read_results(run.cells.pop()), "kernel"
    if recorded is None:  # the kernel died (or the learner broke the reporting): read the printed lines
        recorded, source = printed_outcomes(run), "outputs"
    grades = score(run, expected, recorded)
    if executed_path is not None:
        nbformat.write(run, executed_path)
    return GradeReport(str(path), ids, grades, cell_errors(run), died, source, round(elapsed, 1))
