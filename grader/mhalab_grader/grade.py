"""Grading a submission (``python -m mhalab_grader grade``; README, "For instructors").

:func:`grade` rebuilds the notebook from the instructor's copy, taking only the answer cells from the
submission (:mod:`mhalab_grader.cells`), and runs it in a grading kernel (:mod:`mhalab_grader.kernel`, a process
of its own, in the sandbox of :mod:`mhalab_grader.sandbox`) where the exercise modules cannot be imported.
The grader calls each answer there, as soon as its cell has run, on hidden inputs drawn fresh from a secret
seed, gets back what it returned as plain data, and judges it here against references computed here. The grade
is returned only once every process the submission started is gone. The hidden inputs' seed and the kernel are
passed to each exercise's verdict as arguments. The class side (a folder of submissions, the gradebook,
feedback) is :mod:`mhalab_grader.gradebook`; the fork path (a kernel per submission forked from one that ran
the instructor's cells before the first answer cell) is :mod:`mhalab_grader.zygote`.
"""

from __future__ import annotations

import builtins
import difflib
import inspect
import keyword
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from mhalab.labs.calls import PACKAGE
from mhalab.labs.core import grade_id, load, parse_grade_id
from mhalab.labs.verdicts import PASSED

from .cells import answers, student_version
from .kernel import GradingKernel, KernelGone, _Handed, spec_of
from .sandbox import Limits
from .zygote import Prepared

__all__ = ["MISSING", "NOT_CHECKED", "ExerciseGrade", "GradeReport", "assignment_of", "copy_flag", "grade",
           "instructor_notebook", "prefix_cells", "prepare", "similarity"]

NOT_CHECKED, MISSING = "not checked", "missing"


@dataclass
class ExerciseGrade:
    key: str
    title: str
    points: float
    score: float
    status: str          # passed / failed / error / unanswered / checker error / not checked / missing
    message: str


@dataclass
class GradeReport:
    notebook: str         # the submission's path
    notebooks: list[str]  # the assignment ("07"), from the command line or the file name
    exercises: list[ExerciseGrade]
    score: float
    max_score: float
    errors: list[str]     # "cell 5: ValueError", from the grading kernel
    kernel_died: bool
    elapsed_s: float
    missing: list[str] = field(default_factory=list)  # exercises the submission has no answer cell for
    flags: list[str] = field(default_factory=list)    # for the instructor to look at (copied source, tampering)

    def format(self) -> str:
        width = max([len(e.title) for e in self.exercises] + [10])
        lines = [f"Grade for {self.notebook} (exercises of notebook {', '.join(self.notebooks)}):"]
        for e in self.exercises:
            detail = "" if e.status == PASSED else f"  {e.message}"
            lines.append(f"  {e.key:<6} {e.title:<{width}}  {e.score:g}/{e.points:g}  {e.status}{detail}")
        lines.append(f"  {'total':<6} {'':<{width}}  {self.score:g}/{self.max_score:g}")
        if self.missing:
            lines.append(f"  No answer cell for {', '.join(self.missing)} in the submission: 0 points for "
                         f"{'it' if len(self.missing) == 1 else 'them'}.")
        if self.kernel_died:
            lines.append("  The grading kernel died or ran past its time; the exercises judged before that keep their "
                         "points, the others were not checked.")
        if self.errors:
            lines.append(f"  {len(self.errors)} cell(s) raised errors: " + "; ".join(self.errors[:5]))
        lines += [f"  FLAG: {flag}" for flag in self.flags]
        return "\n".join(lines)


# --------------------------------------------------------------------------- which notebook, and its instructor's copy

NOTEBOOKS = Path(PACKAGE).parent / "notebooks"  # the course's own (instructor) notebooks, in a checkout


def assignment_of(path: str | Path) -> str:
    """The notebook number a submission is graded as, from its file name (``07_what_heads_do.ipynb``) or, in
    nbgrader's layout (``submitted/<student>/<assignment>/x.ipynb``), its folder; never from its contents."""
    path = Path(path)
    for name in (path.name, path.parent.name):
        m = re.match(r"(?:ex)?(\d\d)(?:\D|$)", name)
        if m:
            return m.group(1)
    raise ValueError(f"{path}: cannot tell which notebook this is from its name; name the file (or its assignment "
                     "folder) after the notebook, e.g. 07_what_heads_do.ipynb, or pass --assignment 07")


def instructor_notebook(assignment: str, source: str | Path | None = None) -> Path:
    """The instructor's copy of notebook ``assignment``: ``source`` (a notebook, or a folder holding NN_*.ipynb),
    by default the course's notebooks/ folder."""
    source = Path(source) if source is not None else NOTEBOOKS
    if source.is_file():
        return source
    found = sorted(source.glob(f"{assignment}_*.ipynb")) if source.is_dir() else []
    if not found:
        raise FileNotFoundError(f"no instructor notebook {assignment}_*.ipynb in {source}: pass --source, the folder "
                                "of "
                                "the solution notebooks (the course's notebooks/)")
    return found[0]


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\s\w]", re.sub(r"#.*", "", text))


_KEPT_NAMES = set(dir(builtins)) | set(keyword.kwlist) | {"torch", "np", "F", "nn", "math"}


def _shape(text: str) -> list[str]:
    """The code's tokens with every name of its own (variables, parameters, functions) as ``ID``: renaming
    them does not hide a copy, nor do the quotes. Attributes, keywords, builtins and the usual modules stay."""
    tokens = _tokens(re.sub(r".*\.check\(.*\)\s*$", "", text, flags=re.M).replace("'", '"'))
    return ["ID" if re.fullmatch(r"[A-Za-z_]\w*", t) and t not in _KEPT_NAMES and (i == 0 or tokens[i - 1] != ".")
            else t for i, t in enumerate(tokens)]


def similarity(answer_source: str, ex: Any) -> float:
    """How close (0..1, difflib on the code's tokens, its own names as one) an answer cell is to the course's
    published solution or reference: copying public code cannot be prevented in an open course, only flagged."""
    theirs = [ex.solution_text]
    try:
        theirs.append(inspect.getsource(ex.reference))
    except (TypeError, OSError):
        pass
    mine = _shape(answer_source)
    return max((difflib.SequenceMatcher(None, mine, _shape(t), autojunk=False).ratio() for t in theirs), default=0.0)


#: Flag answers of at least COPY_FLAG_TOKENS tokens this close to the published code, in exercises whose solution has
#: at least COPY_FLAG_SOLUTION_TOKENS: below that, answers that follow the prompt and hints are the solution
#: (issue 30: 1.00 and 0.95 on 09.2 and 08.3; copies, renamed or reformatted, 0.97 to 1.00 everywhere; honest
#: answers to longer solutions at most 0.78; tests/test_labs_copying.py).
COPY_FLAG_RATIO, COPY_FLAG_TOKENS, COPY_FLAG_SOLUTION_TOKENS = 0.9, 60, 100


def copy_flag(answer_source: str, ex: Any) -> float | None:
    """The similarity of an answer cell to the published code of ``ex`` when it is flagged as a copy, else None."""
    if len(_tokens(ex.solution_text)) < COPY_FLAG_SOLUTION_TOKENS or len(_tokens(answer_source)) < COPY_FLAG_TOKENS:
        return None
    ratio = similarity(answer_source, ex)
    return ratio if ratio >= COPY_FLAG_RATIO else None


def prefix_cells(instructor: Any) -> list[tuple[int, str]]:
    """(index, source) of the instructor's code cells before the first code answer cell: the same for every
    submission, so the fork path runs them once per assignment (:mod:`mhalab_grader.zygote`)."""
    first = min((a.index for a in answers(instructor) if not a.written), default=len(instructor.cells))
    return [(i, c.source) for i, c in enumerate(instructor.cells[:first]) if c.cell_type == "code"]


def prepare(assignment: str, *, source: str | Path | None = None, timeout: float | None = 600,
            limits: Limits | None = None, jobs: int = 1) -> Prepared:
    """A kernel that has run notebook ``assignment``'s cells before its first answer cell, to fork per submission."""
    nb_id = str(assignment).zfill(2)
    instructor = nbformat.read(instructor_notebook(nb_id, source), as_version=4)
    spec = spec_of(load(nb_id))
    return Prepared(nb_id, spec, prefix_cells(instructor), timeout=timeout, limits=limits, jobs=jobs)


def grade(path: str | Path, *, assignment: str | None = None, source: str | Path | None = None,
          timeout: float | None = 600, seed: int | None = None, sandboxed: bool = True,
          limits: Limits | None = None, prepared: Prepared | None = None) -> GradeReport:
    """Grade the submission at ``path`` as notebook ``assignment`` (default: from its file or folder name):
    the instructor's copy (from ``source``, default notebooks/) with the submission's answer cells, run in a
    :class:`GradingKernel`, each answer judged here. ``timeout``: seconds one cell or one call may run;
    ``seed``: of the hidden inputs (default: a secret one per run); ``sandboxed`` (default): the kernel runs in
    the sandbox (SandboxUnavailable where none can be made), within ``limits``. ``prepared`` (of this notebook,
    from :func:`prepare`): the kernel is a fork of it, which runs only the cells after its own."""
    path = Path(path)
    nb_id = str(assignment).zfill(2) if assignment is not None else assignment_of(path)
    exercises = load(nb_id)
    instructor = nbformat.read(instructor_notebook(nb_id, source), as_version=4)
    cells = {a.index: a for a in answers(instructor)}
    start = time.perf_counter()
    try:
        submitted, problem = nbformat.read(path, as_version=4), None
    except Exception as error:  # not a notebook: every exercise is missing
        submitted = nbformat.v4.new_notebook()
        problem = f"the submission could not be read as a notebook ({type(error).__name__})"
    theirs: dict[str, Any] = {}
    foreign = set()
    for cell in submitted.cells:
        label = str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
        parsed = parse_grade_id(label)
        if parsed and parsed[0][:2] != nb_id:
            foreign.add(parsed[0][:2])
        if cell.cell_type == "code" and label and label not in theirs:
            theirs[label] = cell
    student = student_version(instructor)
    keys_of = {grade_id(a.key): a.key for a in cells.values() if not a.written}
    missing = sorted(k for g, k in keys_of.items() if g not in theirs)
    run_sources, answer_sources = [], {}
    for index, cell in enumerate(instructor.cells):
        if cell.cell_type != "code":
            continue
        a = cells.get(index)
        if a is not None and not a.written:
            text = theirs[grade_id(a.key)].source if grade_id(a.key) in theirs else student.cells[index].source
            answer_sources[a.key] = text
            run_sources.append((index, text, a.key))
        else:
            run_sources.append((index, cell.source, None))
    spec = spec_of(exercises)
    errors, death, judged, flags = [], None, {}, []
    by_key = {ex.key: ex for ex in exercises}
    seed = secrets.randbits(62) if seed is None else seed

    def judge(ex: Any, handed: dict) -> None:
        judged[ex.key] = _judge(ex, kernel, handed, missing, seed, problem)

    with tempfile.TemporaryDirectory(prefix="mhalab-grade-") as cwd:
        kernel = None
        ran = [(i, text) for i, text, _ in run_sources[:len(prepared.prefix)]] if prepared is not None else None
        if prepared is not None and prepared.usable and prepared.nb_id == nb_id and ran == prepared.prefix:
            try:
                kernel = prepared.fork(timeout, limits)
                errors, run_sources = list(prepared.errors), run_sources[len(ran):]
            except KernelGone as gone:  # (a fresh kernel instead: the same grade, later)
                print(f"{path}: {gone}; grading it in a fresh kernel", file=sys.stderr)
        if kernel is None:
            kernel = GradingKernel(spec, cwd=cwd, timeout=timeout, sandboxed=sandboxed, limits=limits)
        try:
            # Each answer is judged as soon as its cell has run, as q.check does in the learner's kernel, so
            # that a kernel dying later (os._exit, a segfault, a cell killed for its time) keeps what was judged.
            for index, text, key in run_sources:
                where = f"cell {index}" + (f" (the answer cell of exercise {key})" if key else "")
                try:
                    error = kernel.run_cell(text)
                    if error and error != "NotImplementedError":
                        errors.append(f"cell {index}: {error}")
                    if key in by_key and key not in missing and not problem:
                        judge(by_key[key], kernel.handed_in())
                        if kernel.dead:
                            death = f"while the answer of exercise {key} was called"
                            break
                except KernelGone as gone:
                    errors.append(f"cell {index}: {gone}")
                    death = f"in {where}" + (f" ({gone}, so it was killed)" if "ran past" in str(gone) else "")
                    break
            if death is None:  # exercises handed in outside their answer cell (or without one)
                try:
                    handed = kernel.handed_in()
                except KernelGone:
                    death, handed = "after the last cell", {}
                for ex in exercises:
                    if ex.key not in judged:
                        judge(ex, handed)
        finally:
            kernel.close()  # the grade exists only once everything the submission started is gone
    grades = []
    for ex in exercises:
        if ex.key in judged:
            status, message = judged[ex.key]
        elif problem or ex.key in missing:
            status, message = _judge(ex, None, {}, missing, seed, problem)
        else:
            status, message = NOT_CHECKED, (f"the grading kernel died {death}, before this answer could be checked "
                                            "(see the errors)")
        grades.append(ExerciseGrade(ex.key, ex.title, ex.points, ex.points if status == PASSED else 0, status, message))
    if foreign:
        flags.append(f"the submission's answer cells are labelled for notebook {', '.join(sorted(foreign))}; it is "
                     "graded "
                     f"as notebook {nb_id} (from its {'name' if assignment is None else 'assignment'})")
    for key, text in answer_sources.items():
        ex = next(e for e in exercises if e.key == key)
        if key not in missing:
            ratio = copy_flag(text, ex)
            if ratio is not None:
                flags.append(f"exercise {key}: the answer is {ratio:.0%} the same as the course's published solution "
                             "or "
                             "reference (copied?): look at it")
    flags += [f"exercise {g.key}: {g.message}" for g in grades if "sys.setprofile" in g.message]
    total, points = sum(g.score for g in grades), sum(g.points for g in grades)
    return GradeReport(str(path), [nb_id], grades, total, points, errors, death is not None,
                       round(time.perf_counter() - start, 1),
                       missing, flags)


def _judge(ex: Any, kernel: GradingKernel | None, handed: dict, missing: list, seed: int,
           problem: str | None) -> tuple[str, str]:
    if problem:
        return MISSING, problem
    if ex.key in missing:
        return MISSING, f"the submission has no answer cell for it (nbgrader grade_id {grade_id(ex.key)})"
    if ex.key not in handed:
        return NOT_CHECKED, ("its check never ran: the answer cell stopped before `q.check(...)`, or the check was "
                             "removed")
    is_callable, _ = handed[ex.key]
    if is_callable:
        answer: Any = _Handed(ex.template[0] if ex.template else "answer")
    else:
        try:
            answer = kernel.value(ex.key)
        except KernelGone as gone:
            return NOT_CHECKED, str(gone)
    return ex.verdict(answer, runner=kernel, seed=seed)
