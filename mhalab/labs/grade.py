"""Student versions and grading of the lab notebooks, from nbgrader's cell metadata (README, "For instructors").

An answer cell has ``metadata.nbgrader.solution`` true, a ``grade_id`` naming its exercise (``ex03-1-answer``;
a markdown answer ``ex03-1-written``), its solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``,
and ends with its check, ``q1.check(answer)``.

Grading (:func:`grade`) rebuilds the notebook from the instructor's copy, taking only the answer cells from the
submission, and runs it in a grading kernel (:class:`GradingKernel`, a process of its own) where the exercise
modules cannot be imported. The grader then calls each answer there on hidden inputs drawn fresh from a secret
seed, gets back what it returned as plain data, and judges it here against references computed here. The grade
is returned only once every process the submission started is gone. What this does not stop (the learner's
code reads files with your permissions): README, "For instructors".
"""

from __future__ import annotations

import ast
import copy
import ctypes
import difflib
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from . import worker
from .core import PACKAGE, PASSED, STRICT_ENV, load

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


def for_nbgrader(nb: Any) -> Any:
    """A copy of ``nb`` for an nbgrader course's ``source/<assignment>/``: after every code answer cell (an
    nbgrader "autograded answer", left as it is), a locked autograder test cell worth the exercise's points
    (``grade_id`` ``exNN-K-test``) that passes when that answer's check passed, so that ``nbgrader autograde``
    scores each exercise as ``mhalab.labs grade`` does (in the learner's kernel, on the check's own cases).

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
        test.metadata["nbgrader"] = {"grade": True, "grade_id": f"ex{a.key.replace('.', '-')}-test", "locked": True,
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
    notebooks: list[str]  # the assignment ("05"), from the command line or the file name
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
    """The notebook number a submission is graded as, from its file name (``05_what_heads_do.ipynb``) or, in
    nbgrader's layout (``submitted/<student>/<assignment>/x.ipynb``), its folder; never from its contents."""
    path = Path(path)
    for name in (path.name, path.parent.name):
        m = re.match(r"(?:ex)?(\d\d)(?:\D|$)", name)
        if m:
            return m.group(1)
    raise ValueError(f"{path}: cannot tell which notebook this is from its name; name the file (or its assignment "
                     "folder) after the notebook, e.g. 05_what_heads_do.ipynb, or pass --assignment 05")


def instructor_notebook(assignment: str, source: str | Path | None = None) -> Path:
    """The instructor's copy of notebook ``assignment``: ``source`` (a notebook, or a folder holding NN_*.ipynb),
    by default the course's notebooks/ folder."""
    source = Path(source) if source is not None else NOTEBOOKS
    if source.is_file():
        return source
    found = sorted(source.glob(f"{assignment}_*.ipynb")) if source.is_dir() else []
    if not found:
        raise FileNotFoundError(f"no instructor notebook {assignment}_*.ipynb in {source}: pass --source, the folder of "
                                "the solution notebooks (the course's notebooks/)")
    return found[0]


# --------------------------------------------------------------------------- the grading kernel

_STUB = '''"""mhalab.labs while a notebook is graded: ``q.check(answer)`` hands the answer to the grader, which
judges it in its own process. Hints, solutions and references are not available here."""

import json as _json
import os as _os

import _mhalab_grading as _grading

_SPEC = _json.loads(_os.environ.get("MHALAB_GRADING_SPEC", "{}"))
__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load"]


class Wrong(Exception):
    """(Only the grader judges answers.)"""


class Exercise:
    reference = None
    solution_text = ""

    def __init__(self, notebook, number, title):
        self.notebook, self.number, self.title = notebook, number, title
        self.key = f"{notebook}.{number}"
        self.last_status, self.last_message = None, ""

    def check(self, answer):
        _grading.ANSWERS[self.key] = answer
        print(f"Exercise {self.key} ({self.title}): handed in; the grader judges it.")

    def hint(self):
        print(f"(no hints while grading: exercise {self.key})")

    def solution(self):
        print(f"(no solutions while grading: exercise {self.key})")

    def __repr__(self):
        return f"<Exercise {self.key}: {self.title}>"


_EXERCISES = {nb: tuple(Exercise(nb, n, t) for n, t in items) for nb, items in _SPEC.items()}


def available_notebooks():
    return sorted(_EXERCISES)


def load(notebook):
    text = str(notebook).strip().zfill(2)
    if text not in _EXERCISES:
        raise ValueError(f"there are no exercises for notebook {text!r} in this assignment")
    return _EXERCISES[text]


def exercise(notebook, number):
    return next(ex for ex in load(notebook) if ex.number == int(number))
'''

_SANDBOX: dict[str, str] = {}
_SANDBOX_LOCK = threading.Lock()


def sandbox() -> str:
    """A folder (made once per process) holding the grading kernel's code: a copy of mhalab without its exercise
    modules and checkers (a stub ``mhalab.labs`` instead) and the worker."""
    with _SANDBOX_LOCK:
        if "path" in _SANDBOX and os.path.isdir(_SANDBOX["path"]):
            return _SANDBOX["path"]
        root = tempfile.mkdtemp(prefix="mhalab-sandbox-")
        shutil.copytree(PACKAGE, os.path.join(root, "pkg", "mhalab"),
                        ignore=lambda d, names: [n for n in names if n == "__pycache__" or (d == PACKAGE and n == "labs")])
        os.makedirs(os.path.join(root, "pkg", "mhalab", "labs"))
        Path(root, "pkg", "mhalab", "labs", "__init__.py").write_text(_STUB)
        shutil.copy(worker.__file__, os.path.join(root, "_mhalab_grading.py"))
        _SANDBOX["path"] = root
        return root


class KernelGone(Exception):
    """The grading kernel died, or was stopped because it ran past its time."""


_ACTIVE: set[int] = set()  # pids of the grading kernels running now (any thread)
_ACTIVE_LOCK = threading.Lock()


def _become_subreaper() -> None:
    """Orphans of the submission's processes (double fork, setsid) are reparented to this process, so they can
    be found and killed (Linux; elsewhere they escape to init: use a container)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass


def _strays() -> list[int]:
    """Children of this process that no grading kernel is and that left this process's session: what a
    submission started and abandoned (reparented here)."""
    with _ACTIVE_LOCK:  # no grading kernel starts while the scan runs
        return _scan_strays()


def _scan_strays() -> list[int]:
    me, mine = os.getpid(), os.getsid(0)
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid, ppid, sid = int(entry), int(fields[1]), int(fields[3])
        if ppid == me and pid not in _ACTIVE and sid != mine:
            found.append(pid)
    return found


def _kill_strays() -> None:
    for _ in range(50):  # a killed stray's own children are reparented here in turn
        pids = _strays()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


class GradingKernel:
    """A process that runs a notebook's cells and calls its answers on request (:mod:`mhalab.labs.worker`):
    a session of its own, the sandbox's mhalab first on its path, the exercise modules refused on import."""

    GRACE_S = 10.0  # after an interrupt, how long the kernel gets to report back before it is killed

    def __init__(self, spec: dict, *, cwd: str | Path, timeout: float | None = 600):
        _become_subreaper()
        root = sandbox()
        self.timeout, self.dead = timeout, False
        self.home = tempfile.mkdtemp(prefix="mhalab-kernel-")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()
        keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not os.path.isdir(os.path.join(p, "mhalab"))]
        env = {k: v for k, v in os.environ.items() if k not in (STRICT_ENV, "PYTHONPATH")}
        env.update(PYTHONPATH=os.pathsep.join([root, os.path.join(root, "pkg"), *keep]), MPLBACKEND="Agg",
                   MHALAB_GRADING_SPEC=json.dumps(spec), IPYTHONDIR=self.home, PYTHONDONTWRITEBYTECODE="1")
        self.log = open(os.path.join(self.home, "kernel.log"), "wb")
        with _ACTIVE_LOCK:  # (held from the start: another thread's sweep must not take it for a stray)
            self.process = subprocess.Popen(
                [sys.executable, os.path.join(root, "_mhalab_grading.py"), str(to_child), str(from_child)],
                pass_fds=(to_child, from_child), cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
            _ACTIVE.add(self.process.pid)
        os.close(to_child)
        os.close(from_child)
        self._request(None, timeout=max(120.0, timeout or 0))  # its "ready"

    def _request(self, message: dict | None, arrays: list | None = None, *, timeout: float | None) -> tuple[dict, Any]:
        if self.dead:
            raise KernelGone("the grading kernel is gone")
        try:
            if message is not None:
                worker.send(self._w, message, arrays)
            return worker.receive(self._r, timeout)
        except TimeoutError:
            self.interrupt()
            try:
                reply = worker.receive(self._r, self.GRACE_S)
            except (TimeoutError, EOFError, OSError, ValueError):
                self.kill()
                raise KernelGone(f"it ran past {timeout:g} s and did not stop when interrupted") from None
            return {**reply[0], "timed_out": True}, reply[1]
        except (EOFError, OSError, ValueError) as error:
            self.kill()
            raise KernelGone(f"the grading kernel died ({type(error).__name__})") from None

    def interrupt(self) -> None:
        try:
            os.kill(self.process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def run_cell(self, source: str) -> str | None:
        """Run one cell; the class name of what it raised, or None."""
        reply, _ = self._request({"op": "run", "source": source}, timeout=self.timeout)
        if reply.get("timed_out"):
            return f"stopped after {self.timeout:g} s (KeyboardInterrupt)"
        error = reply.get("error")
        return error[:100] if isinstance(error, str) else None if error is None else "an error"

    def handed_in(self) -> dict[str, tuple[bool, str]]:
        """{exercise key: (callable, description)} of what the cells handed to ``q.check``."""
        reply, _ = self._request({"op": "answers"}, timeout=60)
        callables, descriptions = reply.get("callable", {}), reply.get("describe", {})
        if not isinstance(callables, dict) or not isinstance(descriptions, dict):
            return {}
        return {str(k): (bool(callables.get(k)), str(descriptions.get(k, ""))[:200]) for k in reply.get("keys", [])}

    def value(self, key: str) -> Any:
        reply, arrays = self._request({"op": "value", "key": key}, timeout=60)
        if "failed" in reply:
            return worker.Opaque(f"something that could not be sent ({reply['failed']})")
        return worker.decode(reply.get("value"), arrays)

    def call(self, key: str, args: tuple, *, facts: tuple = (), forbid: tuple = ()) -> tuple[str, Any, dict]:
        """Call answer ``key`` on ``args`` in the kernel: ("returned", value, facts) or ("raised", (class, message,
        where), facts), or ("unbound", parameters, {}) when it cannot take them."""
        out: list = []
        request = {"op": "call", "key": key, "args": worker.encode(list(args), out), "facts": list(facts), "forbid": list(forbid)}
        try:
            reply, arrays = self._request(request, out, timeout=self.timeout)
        except KernelGone as gone:
            return "raised", ("TimeoutError" if "ran past" in str(gone) else "KernelGone", str(gone), ""), {}
        found = reply.get("facts") if isinstance(reply.get("facts"), dict) else {}
        if reply.get("timed_out"):
            return "raised", ("TimeoutError", f"it ran past {self.timeout:g} s", ""), found
        try:
            if "returned" in reply:
                return "returned", worker.decode(reply["returned"], arrays), found
            if "unbound" in reply:
                return "unbound", [str(p) for p in reply["unbound"]][:20], {}
        except Exception as error:  # malformed data from the kernel: the learner's code wrote it
            return "raised", ("RuntimeError", f"what came back could not be read ({type(error).__name__})", ""), {}
        if isinstance(reply.get("raised"), list) and len(reply["raised"]) == 3:
            return "raised", tuple(str(x)[:500] for x in reply["raised"]), found
        return "raised", ("RuntimeError", str(reply.get("failed", "no usable reply from the grading kernel"))[:300], ""), found

    def kill(self) -> None:
        self.dead = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the kernel and all it started in its session
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()

    def close(self) -> None:
        """Stop the kernel and everything it started; only then is a grade final."""
        if not self.dead:
            try:
                worker.send(self._w, {"op": "stop"})
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self.process.pid)
        _kill_strays()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


class _Handed:
    """Stands in here for a function the learner handed in: calling it goes through the grading kernel."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        raise RuntimeError("an answer handed in is only called through call_answer")


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\s\w]", re.sub(r"#.*", "", text))


def similarity(answer_source: str, ex: Any) -> float:
    """How close (0..1, difflib on the code's tokens) an answer cell is to the course's published solution or
    reference: copying public code cannot be prevented in an open course, only flagged."""
    mine = _tokens(re.sub(r".*\.check\(.*\)\s*$", "", answer_source, flags=re.M))
    theirs = [ex.solution_text]
    try:
        theirs.append(inspect.getsource(ex.reference))
    except (TypeError, OSError):
        pass
    return max((difflib.SequenceMatcher(None, mine, _tokens(t), autojunk=False).ratio() for t in theirs), default=0.0)


COPY_FLAG_RATIO, COPY_FLAG_TOKENS = 0.9, 60  # flag answers this close to the published code, when this long


def grade(path: str | Path, *, assignment: str | None = None, source: str | Path | None = None,
          timeout: float | None = 600, seed: int | None = None) -> GradeReport:
    """Grade the submission at ``path`` as notebook ``assignment`` (default: from its file or folder name):
    the instructor's copy (from ``source``, default notebooks/) with the submission's answer cells, run in a
    :class:`GradingKernel`, each answer judged here. ``timeout``: seconds one cell or one call may run;
    ``seed``: of the hidden inputs (default: a secret one per run)."""
    path = Path(path)
    nb_id = str(assignment).zfill(2) if assignment is not None else assignment_of(path)
    exercises = load(nb_id)
    instructor = nbformat.read(instructor_notebook(nb_id, source), as_version=4)
    cells = {a.index: a for a in answers(instructor)}
    start = time.perf_counter()
    try:
        submitted, problem = nbformat.read(path, as_version=4), None
    except Exception as error:  # not a notebook: every exercise is missing
        submitted, problem = nbformat.v4.new_notebook(), f"the submission could not be read as a notebook ({type(error).__name__})"
    theirs: dict[str, Any] = {}
    foreign = set()
    for cell in submitted.cells:
        grade_id = str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
        m = _GRADE_ID.match(grade_id)
        if m and m["nb"] != nb_id:
            foreign.add(m["nb"])
        if cell.cell_type == "code" and grade_id and grade_id not in theirs:
            theirs[grade_id] = cell
    student = student_version(instructor)
    keys_of = {f"ex{a.key.replace('.', '-')}-answer": a.key for a in cells.values() if not a.written}
    missing = sorted(k for g, k in keys_of.items() if g not in theirs)
    run_sources, answer_sources = [], {}
    for index, cell in enumerate(instructor.cells):
        if cell.cell_type != "code":
            continue
        a = cells.get(index)
        if a is not None and not a.written:
            grade_id = f"ex{a.key.replace('.', '-')}-answer"
            text = theirs[grade_id].source if grade_id in theirs else student.cells[index].source
            answer_sources[a.key] = text
            run_sources.append((index, text, a.key))
        else:
            run_sources.append((index, cell.source, None))
    spec = {nb_id: [[ex.number, ex.title] for ex in exercises]}
    errors, death, judged, flags = [], None, {}, []
    by_key = {ex.key: ex for ex in exercises}
    seed = secrets.randbits(62) if seed is None else seed

    def judge(ex: Any, handed: dict) -> None:
        judged[ex.key] = _judge(ex, kernel, handed, missing, seed, problem)

    with tempfile.TemporaryDirectory(prefix="mhalab-grade-") as cwd:
        kernel = GradingKernel(spec, cwd=cwd, timeout=timeout)
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
        flags.append(f"the submission's answer cells are labelled for notebook {', '.join(sorted(foreign))}; it is graded "
                     f"as notebook {nb_id} (from its {'name' if assignment is None else 'assignment'})")
    for key, text in answer_sources.items():
        ex = next(e for e in exercises if e.key == key)
        if key not in missing and len(_tokens(text)) >= COPY_FLAG_TOKENS:
            ratio = similarity(text, ex)
            if ratio >= COPY_FLAG_RATIO:
                flags.append(f"exercise {key}: the answer is {ratio:.0%} the same as the course's published solution or "
                             "reference (copied?): look at it")
    flags += [f"exercise {g.key}: {g.message}" for g in grades if "sys.setprofile" in g.message]
    total, points = sum(g.score for g in grades), sum(g.points for g in grades)
    return GradeReport(str(path), [nb_id], grades, total, points, errors, death is not None, round(time.perf_counter() - start, 1),
                       missing, flags)


def _judge(ex: Any, kernel: GradingKernel | None, handed: dict, missing: list, seed: int,
           problem: str | None) -> tuple[str, str]:
    if problem:
        return MISSING, problem
    if ex.key in missing:
        return MISSING, f"the submission has no answer cell for it (nbgrader grade_id ex{ex.key.replace('.', '-')}-answer)"
    if ex.key not in handed:
        return NOT_CHECKED, "its check never ran: the answer cell stopped before `q.check(...)`, or the check was removed"
    is_callable, _ = handed[ex.key]
    if is_callable:
        answer: Any = _Handed(ex.template[0] if ex.template else "answer")
    else:
        try:
            answer = kernel.value(ex.key)
        except KernelGone as gone:
            return NOT_CHECKED, str(gone)
    return ex.verdict(answer, remote=kernel, seed=seed)
