"""A whole class: find the submissions (nbgrader's ``submitted/<student>/<assignment>/*.ipynb``), grade them in
parallel, and write the gradebook CSV, a feedback page per learner and, if asked, Gradescope's results.json."""

from __future__ import annotations

import csv
import html
import json
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mhalab.labs.core import load

from .grade import NOT_CHECKED, ExerciseGrade, GradeReport, assignment_of, grade, prepare
from .sandbox import Limits, SandboxUnavailable, problem


@dataclass
class Submission:
    student: str
    assignment: str   # "07"
    path: Path


def find_submissions(folder: str | Path, assignment: str | None = None) -> list[Submission]:
    """Every ``<student>/<assignment>/*.ipynb`` under ``folder`` (nbgrader's ``submitted/``; a course folder that
    holds ``submitted/`` works too). The assignment is the folder's name (``07`` or ``07_what_heads_do``)."""
    folder = Path(folder)
    if (folder / "submitted").is_dir():
        folder = folder / "submitted"
    found = []
    for path in sorted(folder.glob("*/*/*.ipynb")):
        if path.name.startswith(".") or ".ipynb_checkpoints" in path.parts:
            continue
        nb_id = assignment or assignment_of(path.parent)
        found.append(Submission(path.parent.parent.name, nb_id, path))
    if not found:
        raise FileNotFoundError(f"no submissions in {folder}: expected nbgrader's layout, "
                                "<student>/<assignment>/*.ipynb")
    return found


def _failed_report(sub: Submission, error: BaseException) -> GradeReport:
    """What a submission gets when grading it failed outright: 0 for each exercise, saying why."""
    message = f"grading failed ({type(error).__name__}: {error})"[:300]
    grades = [ExerciseGrade(ex.key, ex.title, ex.points, 0, NOT_CHECKED, message) for ex in load(sub.assignment)]
    return GradeReport(str(sub.path), [sub.assignment], grades, 0, sum(g.points for g in grades), [message], True, 0.0)


def grade_class(submissions: list[Submission], *, source: str | Path | None = None, timeout: float | None = 600,
                jobs: int = 1, progress=print, sandboxed: bool = True, limits: Limits | None = None,
                fork: bool | None = None) -> list[tuple[Submission, GradeReport]]:
    """Grade every submission, ``jobs`` at a time; one that crashes or never ends costs only its own grade.
    SandboxUnavailable before any is graded when ``sandboxed`` and no sandbox can be made here. ``fork``
    (default: on Linux, in the sandbox): each submission's kernel is forked from one that has run the
    instructor's cells before the first answer cell, once per assignment (:mod:`mhalab_grader.zygote`)."""
    if sandboxed and problem():
        raise SandboxUnavailable(problem())
    fork = default_fork(sandboxed) if fork is None else fork and default_fork(sandboxed)
    prepared: dict = {}
    lock = threading.Lock()

    def prepared_for(nb_id: str):
        with lock:  # one per assignment, made by the first submission that needs it
            if fork and nb_id not in prepared:
                try:
                    prepared[nb_id] = prepare(nb_id, source=source, timeout=timeout, limits=limits, jobs=jobs)
                except Exception:  # noqa: BLE001 (then a fresh kernel per submission, as without --fork)
                    traceback.print_exc()
                    prepared[nb_id] = None
            return prepared.get(nb_id)

    def one(sub: Submission) -> tuple[Submission, GradeReport]:
        try:
            report = grade(sub.path, assignment=sub.assignment, source=source, timeout=timeout, sandboxed=sandboxed,
                           limits=limits, prepared=prepared_for(sub.assignment))
        except Exception as error:  # noqa: BLE001 (the run goes on; the traceback is for the instructor)
            traceback.print_exc()
            report = _failed_report(sub, error)
        if progress:
            progress(f"{sub.student} {sub.assignment}: {report.score:g}/{report.max_score:g} ({report.elapsed_s:g} s)")
        return sub, report

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, submissions))
    finally:
        for kernel in prepared.values():
            if kernel is not None:
                kernel.close()


def default_fork(sandboxed: bool = True) -> bool:
    """Whether the fork path can be taken here: Linux (namespaces, pidfds) and the sandbox."""
    return sandboxed and sys.platform.startswith("linux")


def write_gradebook(results: list[tuple[Submission, GradeReport]], path: str | Path) -> list[str]:
    """One row per learner, one column per exercise (of every assignment graded), the total and the flags."""
    keys = sorted({e.key for _, r in results for e in r.exercises}, key=lambda k: (k[:2], int(k.split(".")[1])))
    rows: dict[str, dict] = {}
    for sub, report in results:
        row = rows.setdefault(sub.student, {"student": sub.student, "total": 0.0, "max_total": 0.0, "flags": []})
        for e in report.exercises:
            row[e.key] = e.score
        row["total"] += report.score
        row["max_total"] += report.max_score
        row["flags"] += [f"{sub.assignment}: {f}" for f in report.flags]
    header = ["student", *keys, "total", "max_total", "flags"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, header, restval="")
        writer.writeheader()
        for student in sorted(rows):
            row = rows[student]
            writer.writerow({**row, "total": f"{row['total']:g}", "max_total": f"{row['max_total']:g}",
                             "flags": " | ".join(row["flags"])})
    return header


def feedback_html(student: str, report: GradeReport) -> str:
    """A learner's feedback page: each exercise's score and message (messages describe the hidden inputs by
    their shapes at most, never their values); no flags, which are for the instructor."""
    rows = "\n".join(
        f"<tr class='{html.escape(e.status.replace(' ', '-'))}'><td>{html.escape(e.key)}</td>"
        f"<td>{html.escape(e.title)}</td>"
        f"<td>{e.score:g}/{e.points:g}</td><td>{html.escape(e.status)}</td><td>{html.escape(e.message)}</td></tr>"
        for e in report.exercises)
    notes = ""
    if report.missing:
        notes += f"<p>No answer cell for {html.escape(', '.join(report.missing))} in your notebook.</p>"
    if report.kernel_died:
        notes += ("<p>Your notebook stopped (its kernel died or ran past its time) before every answer was checked: "
                  "the "
                  "answers checked before that keep their points.</p>")
    nb = html.escape(", ".join(report.notebooks))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Feedback: notebook {nb}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .6em;"
            "border-bottom:1px solid #ddd;text-align:left;vertical-align:top}.passed td:nth-child(4){color:#176}"
            "</style></head><body>"
            f"<h1>Notebook {nb}: {report.score:g} of {report.max_score:g} points</h1><p>{html.escape(student)}</p>"
            f"<table><tr><th>exercise</th><th></th><th>score</th><th>status</th><th>what the check says</th></tr>"
            f"{rows}</table>{notes}</body></html>\n")


def gradescope_results(report: GradeReport) -> dict:
    """Gradescope's autograder results.json: one test per exercise (score, max_score, name, output, visibility);
    the grader's own log (Gradescope's stdout) stays the instructor's."""
    return {
        "score": report.score,
        "stdout_visibility": "hidden",
        "tests": [{"name": f"Exercise {e.key}: {e.title}", "score": e.score, "max_score": e.points,
                   "output": e.message if e.status != "passed" else "correct.", "visibility": "visible"}
                  for e in report.exercises],
        "output": ("No answer cell for " + ", ".join(report.missing) + ".") if report.missing else "",
    }


def write_outputs(results: list[tuple[Submission, GradeReport]], out_dir: str | Path, *,
                  gradescope: bool = False) -> None:
    """gradebook.csv, feedback/<student>/<assignment>.html and, with ``gradescope``,
    gradescope/<student>/<assignment>.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_gradebook(results, out_dir / "gradebook.csv")
    for sub, report in results:
        page = out_dir / "feedback" / sub.student / f"{sub.assignment}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(feedback_html(sub.student, report))
        if gradescope:
            target = out_dir / "gradescope" / sub.student / f"{sub.assignment}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(gradescope_results(report), indent=2) + "\n")
