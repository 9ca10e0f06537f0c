"""Answer cells, from nbgrader's cell metadata (README, "For instructors"), and what is made of them: the
student version (``python -m mhalab_grader release``) and a copy for nbgrader's own autograder.

An answer cell has ``metadata.nbgrader.solution`` true, a ``grade_id`` naming its exercise (``ex04-1-answer``;
a markdown answer ``ex04-1-written``), its solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``,
and ends with its check, ``q1.check(answer)``.

Not nbgrader's preprocessors: its ClearSolutions writes one code stub for every region (``raise
NotImplementedError()``), where a variable answer must become ``name = None`` for its check to say
"unanswered", and a stub must name its exercise; its OverwriteCells restores locked cells from nbgrader's
database, where the grader rebuilds the whole notebook from the instructor's copy and takes nothing but the
answer cells from a submission (a cell the learner added or unlocked never runs). Both would also make
nbgrader (its database, its application) a dependency of grading; :func:`for_nbgrader` serves courses that
use it.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from mhalab.labs.core import grade_id, load, parse_grade_id

BEGIN_LINE, END_LINE = "### BEGIN SOLUTION", "### END SOLUTION"


class MarkerError(ValueError):
    """Answer cells or solution markers that are malformed (the message lists every problem)."""


@dataclass
class Answer:
    """One answer cell: which exercise it answers and what its check passes along."""

    index: int                      # the cell's index in the notebook
    key: str                        # "04.1"
    written: bool = False           # a markdown answer (not auto-graded)
    expression: str | None = None   # the answer the check takes, as source: "attention"
    checker: str | None = None      # what the check is called on, as source: "q1"
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
            raise MarkerError(f"line {i + 1}: {line.strip()!r} mentions a solution marker; write the marker on a "
                              f"line of its own, exactly as {BEGIN_LINE!r} or {END_LINE!r}")
        if is_begin and start is not None:
            raise MarkerError(f"line {i + 1}: a second BEGIN SOLUTION before the END SOLUTION of the one on "
                              f"line {start + 1}")
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
    answer.borrows = any(isinstance(n, ast.Attribute) and n.attr in ("reference", "solution_text")
                         for n in ast.walk(tree))
    calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "check" and n.value.args]
    if calls:
        answer.expression = ast.get_source_segment(text, calls[-1].args[0])
        answer.checker = ast.get_source_segment(text, calls[-1].func.value)
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
        parsed = parse_grade_id(meta.get("grade_id", ""))
        if not meta.get("solution"):
            if regions:
                problems.append(f"cell {index}: a solution region outside an answer cell; give the cell nbgrader "
                                'metadata {"solution": true, "grade": false, "locked": false, "schema_version": 3, '
                                '"grade_id": "exNN-K-answer"}')
        elif not parsed:
            problems.append(f"cell {index}: grade_id {meta.get('grade_id')!r} should be exNN-K-answer "
                            "(or exNN-K-written)")
        else:
            answer = Answer(index, parsed[0], written=parsed[1] == "written")
            if cell.cell_type == "code" and not _read_check(answer, cell.source):
                problems.append(f"cell {index}: an answer cell ends with its check, q.check(answer), and this one "
                                "has none")
            else:
                found.append(answer)
    keys = [a.key for a in found if not a.written]
    problems += [f"exercise {k} has two answer cells" for k in sorted({k for k in keys if keys.count(k) > 1})]
    if problems and strict:
        raise MarkerError("; ".join(problems))
    return found


def student_version(nb: Any) -> Any:
    """A copy of ``nb`` with every solution region replaced by a placeholder and the answer cells' outputs cleared.
    The lesson's outputs stay: the figures and numbers a learner reads before running anything (the cells after
    an exercise ran on its solution, and run on the course's answer until the learner's passes: ``q.use``)."""
    found = {a.index: a for a in answers(nb)}
    student = copy.deepcopy(nb)
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
                    stub = ["# YOUR CODE HERE",
                            f'raise NotImplementedError("Exercise {answer.key}: write your answer here")']
                out += lines[last:begin] + [indent + s for s in stub]
                last = end + 1
            cell.source = "\n".join(out + lines[last:])
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        cell.get("metadata", {}).pop("execution", None)
    return student


def for_nbgrader(nb: Any) -> Any:
    """A copy of ``nb`` for an nbgrader course's ``source/<assignment>/``: after every code answer cell (an
    nbgrader "autograded answer", left as it is), a locked autograder test cell worth the exercise's points
    (``grade_id`` ``exNN-K-test``) that passes when that answer's check passed, so that ``nbgrader autograde``
    scores each exercise as ``mhalab_grader grade`` does (in the learner's kernel, on the check's own cases).

    nbgrader gives points only to cells with ``grade`` true, and a cell with both ``grade`` and ``solution``
    true is a *manually* graded answer, which autograde leaves at 0 until a person grades it: hence a
    test cell of its own rather than ``grade`` on the answer cell."""
    out = copy.deepcopy(nb)
    found = answers(out)
    for a in sorted(found, key=lambda a: a.index, reverse=True):  # from the end, so the indices stay right
        if a.written:
            continue
        ex = next(e for e in load(a.key[:2]) if e.key == a.key)
        q = a.checker
        test = nbformat.v4.new_code_cell(
            f"# nbgrader's test of exercise {a.key} ({ex.points:g} point{'s' if ex.points != 1 else ''}): its check, "
            "in the answer cell above, passed\n"
            f"assert {q}.last_status == \"passed\", {q}.last_message or \"exercise {a.key}: its check did not run\"")
        test.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id(a.key, "test"), "locked": True,
                                     "points": ex.points, "schema_version": 3, "solution": False}
        if "id" in test:  # (nbformat 4.5 cell ids) the same on every run
            test.id = test.metadata["nbgrader"]["grade_id"]
        out.cells.insert(a.index + 1, test)
    return out


def release(source: str | Path, out_dir: str | Path, *, dry_run: bool = False) -> dict[str, list[Answer]]:
    """Write the student version of every notebook in ``source`` (a folder, or one notebook) to ``out_dir``,
    once all are checked. Returns {notebook name: its answer cells}."""
    source, out_dir = Path(source), Path(out_dir)
    if not source.exists():
        raise FileNotFoundError(f"{source} is neither a notebook nor a folder of notebooks")
    paths = [source] if source.is_file() else sorted(p for p in source.glob("*.ipynb") if not p.name.startswith("."))
    if not dry_run and any((out_dir / p.name).resolve() == p.resolve() for p in paths):
        raise ValueError(f"the student versions must go to another folder than {out_dir}: they would overwrite "
                         "the solutions")
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
