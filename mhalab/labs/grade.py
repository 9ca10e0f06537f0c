"""Student versions and grading of the lab notebooks, from nbgrader's cell metadata (README, "For instructors").

An answer cell has ``metadata.nbgrader.solution`` true, a ``grade_id`` naming its exercise (``ex03-1-answer``;
a markdown answer ``ex03-1-written``), its solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``,
and ends with its check, ``q1.check(answer)``, whose argument the grader calls in the learner's kernel. What
it returned is judged here; the learner's code runs with your permissions: grade untrusted work in a container.
"""

from __future__ import annotations

import ast
import copy
import os
import re
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from .core import FAILED, PASSED, STRICT_ENV, exercise, load

BEGIN_LINE, END_LINE = "### BEGIN SOLUTION", "### END SOLUTION"
_GRADE_ID = re.compile(r"^ex(?P<nb>\d\d)-(?P<num>\d+)-(?P<kind>answer|written)$")


class MarkerError(ValueError):
    """Answer cells or solution markers that are malformed (the message lists every problem)."""


@dataclass
class Answer:
    """One answer cell: which exercise it answers and what its check passes along."""

    index: int                      # the cell's index in the notebook
    key: str                        # "03.1"
    written: bool = False           # a markdown answer (not auto-graded)
    expression: str | None = None   # the answer the check takes, as source: "attention"
    borrows: bool = False           # the cell reads an exercise's reference or solution text


def solution_regions(text: str, *, code: bool = True) -> list[tuple[int, int]]:
    """(begin line, end line) of every solution region, 0-based and inclusive of the markers; MarkerError
    for unpaired markers, or (in code) a marker line that is not exactly ``### BEGIN/END SOLUTION``."""
    regions, start = [], None
    for i, line in enumerate(text.split("\n")):
        is_begin, is_end = "BEGIN SOLUTION" in line, "END SOLUTION" in line
        if not (is_begin or is_end):
            continue
        if code and line.strip() not in (BEGIN_LINE, END_LINE):
            raise MarkerError(f"line {i + 1}: {line.strip()!r} mentions a solution marker; write the marker on a line of "
                              f"its own, exactly as {BEGIN_LINE!r} or {END_LINE!r}")
        if is_begin and start is not None:
            raise MarkerError(f"line {i + 1}: a second BEGIN SOLUTION before the END SOLUTION of the one on line {start + 1}")
        if is_end and start is None:
            raise MarkerError(f"line {i + 1}: END SOLUTION without a BEGIN SOLUTION before it")
        if is_begin:
            start = i
        else:
            regions.append((start, i))
            start = None
    if start is not None:
        raise MarkerError(f"line {start + 1}: BEGIN SOLUTION without an END SOLUTION after it")
    return regions


def _read_check(answer: Answer, text: str) -> bool:
    """Fill in what the cell's last top-level ``X.check(...)`` passes; False when there is none."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    answer.borrows = any(isinstance(n, ast.Attribute) and n.attr in ("reference", "solution_text") for n in ast.walk(tree))
    calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "check" and n.value.args]
    if calls:
        answer.expression = ast.get_source_segment(text, calls[-1].args[0])
    return bool(calls)


def answers(nb: Any, *, strict: bool = True) -> list[Answer]:
    """Every answer cell of ``nb``, in order. Malformed cells raise :class:`MarkerError` listing every problem,
    or with ``strict=False`` (grading a submission a learner may have edited) are left out."""
    found, problems = [], []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        try:
            regions = solution_regions(cell.source, code=cell.cell_type == "code") if cell.cell_type != "raw" else []
        except MarkerError as error:
            problems.append(f"cell {index}: {error}")
            continue
        m = _GRADE_ID.match(str(meta.get("grade_id", "")))
        if not meta.get("solution"):
            if regions:
                problems.append(f"cell {index}: a solution region outside an answer cell; give the cell nbgrader metadata "
                                '{"solution": true, "grade": false, "locked": false, "schema_version": 3, "grade_id": "exNN-K-answer"}')
        elif not m:
            problems.append(f"cell {index}: grade_id {meta.get('grade_id')!r} should be exNN-K-answer (or exNN-K-written)")
        else:
            answer = Answer(index, f"{m['nb']}.{int(m['num'])}", written=m["kind"] == "written")
            if cell.cell_type == "code" and not _read_check(answer, cell.source):
                problems.append(f"cell {index}: an answer cell ends with its check, q.check(answer), and this one has none")
            else:
                found.append(answer)
    keys = [a.key for a in found if not a.written]
    problems += [f"exercise {k} has two answer cells" for k in sorted({k for k in keys if keys.count(k) > 1})]
    if problems and strict:
        raise MarkerError("; ".join(problems))
    return found


def student_version(nb: Any) -> Any:
    """A copy of ``nb`` with every solution region replaced by a placeholder, and the exercise outputs cleared
    (from the first answer cell on, except in cells tagged ``keep-output``)."""
    found = {a.index: a for a in answers(nb)}
    student = copy.deepcopy(nb)
    first = min(found, default=len(nb.cells))
    for index, cell in enumerate(student.cells):
        if index in found:
            answer, lines = found[index], cell.source.split("\n")
            out, last = [], 0
            for begin, end in solution_regions(cell.source, code=cell.cell_type == "code"):
                indent = re.match(r"[ \t]*", lines[begin]).group(0)
                if cell.cell_type == "markdown":
                    stub = ["YOUR ANSWER HERE"]
                elif not indent and answer.expression and answer.expression.isidentifier():  # a top-level variable
                    stub = [f"# YOUR CODE HERE: exercise {answer.key}", f"{answer.expression} = None"]
                else:
                    stub = ["# YOUR CODE HERE", f'raise NotImplementedError("Exercise {answer.key}: write your answer here")']
                out += lines[last:begin] + [indent + s for s in stub]
                last = end + 1
            cell.source = "\n".join(out + lines[last:])
        if cell.cell_type == "code" and index >= first and "keep-output" not in cell.get("metadata", {}).get("tags", []):
            cell.outputs, cell.execution_count = [], None
        cell.get("metadata", {}).pop("execution", None)
    return student


def release(source: str | Path, out_dir: str | Path, *, dry_run: bool = False) -> dict[str, list[Answer]]:
    """Write the student version of every notebook in ``source`` (a folder, or one notebook) to ``out_dir``,
    once all are checked. Returns {notebook name: its answer cells}."""
    source, out_dir = Path(source), Path(out_dir)
    if not source.exists():
        raise FileNotFoundError(f"{source} is neither a notebook nor a folder of notebooks")
    paths = [source] if source.is_file() else sorted(p for p in source.glob("*.ipynb") if not p.name.startswith("."))
    if not dry_run and any((out_dir / p.name).resolve() == p.resolve() for p in paths):
        raise ValueError(f"the student versions must go to another folder than {out_dir}: they would overwrite the solutions")
    found, students, problems = {}, {}, []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        try:
            found[path.name], students[path.name] = answers(nb), student_version(nb)
        except MarkerError as error:
            problems.append(f"{path.name}: {error}")
            continue
        keys = [a.key for a in found[path.name] if not a.written]
        missing = [ex.key for nb_id in sorted({k[:2] for k in keys}) for ex in load(nb_id) if ex.key not in keys]
        print(f"{path.name}: " + (f"answer cells for {', '.join(keys)}" if keys else "no exercises, copied unchanged")
              + (f"; WARNING: no answer cell for {', '.join(missing)}" if missing else ""))
    if problems:
        raise MarkerError("malformed answer cells:\n  " + "\n  ".join(problems))
    if not dry_run:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, nb in students.items():
            nbformat.write(nb, out_dir / name)
        print(f"wrote {len(students)} student notebook(s) to {out_dir}")
    return found


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
    score: float
    max_score: float
    errors: list[str]     # "cell 5: ValueError", from the executed notebook
    kernel_died: bool
    elapsed_s: float

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


def collect(spec: dict[str, str], namespace: dict, path: str) -> None:
    """Run in the learner's kernel by the grader's last cell: record every answer to ``path``. ``spec`` maps
    an exercise key to its check's argument as source ("attention")."""
    recorded: dict[str, Any] = {}
    for key, expression in spec.items():
        step = f"`{expression}` could not be evaluated after the notebook ran"  # e.g. the cell stopped before it
        try:
            answer = eval(expression, namespace)  # noqa: S307  (the learner's own kernel)
            step = "recording the answer failed"
            recorded[key] = exercise(*key.split(".")).record(answer)
        except Exception as error:
            recorded[key] = {"problem": f"{step} ({type(error).__name__}: {error})"[:300]}
    torch.save(recorded, path)


def execute(nb: Any, *, cwd: str | Path, timeout: float | None = 600, kernel_name: str = "python3") -> tuple[Any, bool]:
    """Run every cell of ``nb`` in place, continuing past errors; return (nb, kernel_died)."""
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True, interrupt_on_timeout=True,
                            record_timing=False, resources={"metadata": {"path": str(cwd)}})
    env = {k: v for k, v in os.environ.items() if k != STRICT_ENV}  # grading never stops at a failed check
    try:
        client.execute(env=env, stderr=subprocess.DEVNULL)  # the kernel's start-up noise is not the learner's
    except DeadKernelError:  # the cells run so far keep their outputs
        return nb, True
    return nb, False


def grade(path: str | Path, *, timeout: float | None = 600, kernel_name: str = "python3",
          executed_path: str | Path | None = None) -> GradeReport:
    """Execute the notebook at ``path`` (in its folder) and grade its exercises. ``timeout``: seconds one cell
    may run (None: no limit); ``executed_path``: also save the executed notebook there."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    cells = [a for a in answers(nb, strict=False) if not a.written]
    ids = sorted({a.key[:2] for a in cells})
    if not ids:
        raise ValueError(f"{path}: no answer cells (cells with nbgrader metadata, grade_id like ex03-1-answer)")
    spec = {a.key: a.expression for a in cells}
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
    total, points = sum(g.score for g in grades), sum(g.points for g in grades)
    return GradeReport(str(path), ids, grades, total, points, errors, died, round(elapsed, 1))
