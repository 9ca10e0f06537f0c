"""Student versions of the course notebooks: solutions out, placeholders in.

The solution notebooks mark each answer with nbgrader's delimiters, on lines of their own::

    def d_k_for(d_model, n_heads):
        ### BEGIN SOLUTION
        return d_model // n_heads
        ### END SOLUTION

    q1.check(d_k_for)

:func:`student_version` replaces every such region (as ``nbgrader generate_assignment`` does, keeping
the indentation of the BEGIN line) with::

        # YOUR CODE HERE
        raise NotImplementedError("Your answer here: exercise 03.1 (...); q1.hint() gives a hint.")

and clears the outputs of the exercise section: every code cell from the first one that loads
exercises, the first that checks an exercise or holds a solution region, to the end of
the notebook (results computed from an answer would give it away), plus any cell tagged ``exercise`` or
marked as an nbgrader solution/grade cell. A cell in that section tagged ``keep-output`` keeps its output. Everything before the exercises
(explanations, plots, their outputs) is kept as it is. In a markdown cell a solution region becomes
nbgrader's text stub, ``YOUR ANSWER HERE``.

Command line: ``python -m mhalab.labs release notebooks/ OUT_DIR`` (``--check`` only lists).

For nbgrader, :func:`mark_answer_cells` gives the cells holding solution regions the cell metadata
nbgrader needs (``python -m mhalab.labs nbgrader --mark notebooks/``, in place), so the solution
notebooks go into an nbgrader course's ``source/`` folder unchanged; :func:`nbgrader_version` makes
copies that also split each check into a locked, autograded test cell.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEGIN, END = "BEGIN SOLUTION", "END SOLUTION"  # what nbgrader looks for (modern nbgrader: anywhere in a line)
BEGIN_LINE, END_LINE = "### BEGIN SOLUTION", "### END SOLUTION"  # the exact form every nbgrader version accepts
CODE_STUB = "# YOUR CODE HERE"
TEXT_STUB = "YOUR ANSWER HERE"
KEEP_OUTPUT_TAG = "keep-output"
EXERCISE_TAG = "exercise"

_LABS = r"(?:mhalab\.)?labs\."
_LOAD = re.compile(rf"^[ \t]*(?P<targets>[\w \t,()\[\]]+?)[ \t]*=[ \t]*{_LABS}load\([ \t]*[\"']?(?P<nb>\d+)[\"']?[ \t]*\)", re.M)
_ONE = re.compile(rf"^[ \t]*(?P<var>\w+)[ \t]*=[ \t]*{_LABS}exercise\([ \t]*[\"']?(?P<nb>\d+)[\"']?[ \t]*,[ \t]*(?P<num>\d+)[ \t]*\)", re.M)
_MENTION = re.compile(rf"{_LABS}(?:load|exercise)\([ \t]*[\"']?(?P<nb>\d+)[\"']?")
_INLINE_CHECK = re.compile(rf"{_LABS}exercise\([ \t]*[\"']?(?P<nb>\d+)[\"']?[ \t]*,[ \t]*(?P<num>\d+)[ \t]*\)\.check\(")
_CALL = re.compile(r"\b(?P<var>[A-Za-z_]\w*)\.check\(")


class MarkerError(ValueError):
    """Solution delimiters that are unbalanced, nested or not written as nbgrader expects."""


# --------------------------------------------------------------------------- reading a notebook


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: Any) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _nbgrader_exercise(cell: Any) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade"))


def notebook_ids(nb: Any, path: str | Path | None = None) -> list[str]:
    """The notebook numbers whose exercises ``nb`` uses: from its ``labs.load("NN")`` /
    ``labs.exercise("NN", k)`` calls, else from a file name starting with two digits."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for m in _MENTION.finditer(_source(cell)):
                nb_id = m.group("nb").zfill(2)
                if nb_id not in found:
                    found.append(nb_id)
    if not found and path is not None:
        m = re.match(r"(\d\d)(?:_|\b)", Path(path).name)
        if m:
            found.append(m.group(1))
    return found


def bindings(nb: Any) -> dict[str, str | None]:
    """Which variable holds which exercise: {"q1": "03.1", ...} (None where the key is unknown)."""
    from .core import load

    found: dict[str, str | None] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = _source(cell)
        for m in _LOAD.finditer(text):
            names = [t.strip() for t in re.sub(r"[()\[\]]", " ", m.group("targets")).split(",") if t.strip()]
            try:
                keys = [ex.key for ex in load(m.group("nb"))]
            except ValueError:
                keys = []
            for i, name in enumerate(names):
                found[name] = keys[i] if i < len(keys) else None
        for m in _ONE.finditer(text):
            found[m.group("var")] = f"{m.group('nb').zfill(2)}.{int(m.group('num'))}"
    return found


def checks_in(text: str, bound: dict[str, str | None]) -> list[tuple[int, str | None]]:
    """(offset, exercise key) of every exercise check in ``text``, in order."""
    hits = [(m.start(), f"{m.group('nb').zfill(2)}.{int(m.group('num'))}") for m in _INLINE_CHECK.finditer(text)]
    for m in _CALL.finditer(text):
        var = m.group("var")
        if var in bound:
            hits.append((m.start(), bound[var]))
        elif not bound and var not in ("self", "torch", "np"):  # no bindings seen: any .check( counts
            hits.append((m.start(), None))
    return sorted(hits, key=lambda h: h[0])


def solution_regions(text: str, *, code: bool = True) -> list[tuple[int, int]]:
    """(begin line, end line) of every solution region, 0-based and inclusive of the markers.

    Raises :class:`MarkerError` for nested or unterminated regions, an END without a BEGIN, and (in
    code cells) a marker line that is not exactly ``### BEGIN SOLUTION`` / ``### END SOLUTION``.
    """
    regions, start = [], None
    for i, line in enumerate(text.split("\n")):
        is_begin, is_end = BEGIN in line, END in line
        if not (is_begin or is_end):
            continue
        if code and line.strip() not in (BEGIN_LINE, END_LINE):
            raise MarkerError(
                f"line {i + 1}: {line.strip()!r} mentions a solution marker; write the marker on a line of its own, "
                f"exactly as {BEGIN_LINE!r} or {END_LINE!r}"
            )
        if is_begin:
            if start is not None:
                raise MarkerError(f"line {i + 1}: a second BEGIN SOLUTION before the END SOLUTION of the one on line {start + 1}")
            start = i
        else:
            if start is None:
                raise MarkerError(f"line {i + 1}: END SOLUTION without a BEGIN SOLUTION before it")
            regions.append((start, i))
            start = None
    if start is not None:
        raise MarkerError(f"line {start + 1}: BEGIN SOLUTION without an END SOLUTION after it")
    return regions


def replace_regions(text: str, stub: list[str], *, code: bool = True) -> tuple[str, int]:
    """``text`` with every solution region replaced by ``stub`` (indented like its BEGIN line)."""
    lines = text.split("\n")
    regions = solution_regions(text, code=code)
    out, last = [], 0
    for begin, end in regions:
        out += lines[last:begin]
        indent = re.match(r"[ \t]*", lines[begin]).group(0)
        out += [indent + s if s else s for s in stub]
        last = end + 1
    out += lines[last:]
    return "\n".join(out), len(regions)


# --------------------------------------------------------------------------- the plan


@dataclass
class CellPlan:
    index: int
    cell_type: str
    regions: int = 0                      # solution regions replaced in this cell
    answers: str | None = None            # the exercise those regions answer (the next check after them)
    checks: list[str | None] = field(default_factory=list)  # exercises checked in this cell
    clear: bool = False                   # its outputs are cleared in the student version


@dataclass
class ReleasePlan:
    notebooks: list[str]                  # notebook numbers whose exercises are used
    cells: list[CellPlan]
    expected: list[str]                   # exercise keys the registry has for those notebooks
    problems: list[str] = field(default_factory=list)   # errors: no student version can be made
    warnings: list[str] = field(default_factory=list)

    @property
    def n_regions(self) -> int:
        return sum(c.regions for c in self.cells)

    @property
    def checked(self) -> list[str]:
        return [k for c in self.cells for k in c.checks if k]

    def summary(self) -> str:
        def spans(indices: list[int]) -> str:
            return ", ".join(str(i) for i in indices) or "none"

        lines = [
            f"exercises of notebook(s) {', '.join(self.notebooks) or 'none'}: {', '.join(self.expected) or 'none registered'}",
            f"{self.n_regions} solution region(s) -> placeholders, in cells {spans([c.index for c in self.cells if c.regions])}",
            f"outputs cleared in cells {spans([c.index for c in self.cells if c.clear])}",
            f"checks in cells {spans([c.index for c in self.cells if c.checks])}: {', '.join(k or '?' for k in self.checked) or 'none'}",
        ]
        lines += [f"WARNING: {w}" for w in self.warnings]
        lines += [f"ERROR: {p}" for p in self.problems]
        return "\n".join(lines)


def plan(nb: Any, path: str | Path | None = None) -> ReleasePlan:
    """What :func:`student_version` will do to ``nb`` (nothing is changed)."""
    from .core import load

    ids = notebook_ids(nb, path)
    expected: list[str] = []
    warnings: list[str] = []
    for nb_id in ids:
        try:
            expected += [ex.key for ex in load(nb_id)]
        except ValueError as error:
            warnings.append(str(error))
    bound = bindings(nb)
    cells, problems = [], []
    pending: list[CellPlan] = []  # cells whose regions wait for the next check to say which exercise they answer
    section_started = False
    for index, cell in enumerate(nb.cells):
        cp = CellPlan(index, cell.cell_type)
        text = _source(cell)
        is_code = cell.cell_type == "code"
        if cell.cell_type in ("code", "markdown"):
            try:
                regions = solution_regions(text, code=is_code)
            except MarkerError as error:
                problems.append(f"cell {index}: {error}")
                regions = []
            cp.regions = len(regions)
        if is_code:
            hits = checks_in(text, bound)
            cp.checks = [key for _, key in hits]
            last_end = len("\n".join(text.split("\n")[: regions[-1][1] + 1])) if cp.regions else -1
            after = [key for offset, key in hits if offset > last_end]
            if cp.regions:
                pending.append(cp)
            if after or (hits and not cp.regions):
                for waiting in pending:
                    waiting.answers = (after or [key for _, key in hits])[0]
                pending = []
            opens = bool(cp.regions or hits or EXERCISE_TAG in _tags(cell) or _nbgrader_exercise(cell))
            section_started = section_started or opens
            cp.clear = (section_started and KEEP_OUTPUT_TAG not in _tags(cell)) or cp.regions > 0 or bool(hits)
        cells.append(cp)
    for waiting in pending:
        warnings.append(f"cell {waiting.index}: a solution region with no exercise check after it")
    checked = {k for c in cells for k in c.checks if k}
    for key in expected:
        if key not in checked:
            warnings.append(f"exercise {key} is registered but no cell checks it (it will always grade as 0)")
    for c in cells:
        for key in c.checks:
            if key is not None and key not in expected:
                warnings.append(f"cell {c.index} checks exercise {key}, which the registry does not have")
    return ReleasePlan(ids, cells, expected, problems, warnings)


def _instruction(key: str | None, bound: dict[str, str | None]) -> str:
    if key is None:
        return "Your answer here: replace this line with your code, then run the cell to check it."
    from .core import exercise

    var = next((v for v, k in bound.items() if k == key), None)
    try:
        ex = exercise(*key.split("."))
        what = f"exercise {key} ({ex.title})"
    except ValueError:
        what = f"exercise {key}"
    helper = f"; {var}.hint() gives a hint" if var else ""
    return f"Your answer here: {what}. Replace this line with your code{helper}."


def student_version(nb: Any, path: str | Path | None = None) -> tuple[Any, ReleasePlan]:
    """A copy of ``nb`` with solution regions replaced and exercise outputs cleared, and the plan.

    Raises :class:`MarkerError` (listing every problem) when the markers are malformed.
    """
    the_plan = plan(nb, path)
    if the_plan.problems:
        raise MarkerError("; ".join(the_plan.problems))
    bound = bindings(nb)
    student = copy.deepcopy(nb)
    for cp, cell in zip(the_plan.cells, student.cells):
        if cp.regions:
            if cp.cell_type == "code":
                stub = [CODE_STUB, f"raise NotImplementedError({json.dumps(_instruction(cp.answers, bound), ensure_ascii=False)})"]
                cell.source, _ = replace_regions(_source(cell), stub, code=True)
            else:
                cell.source, _ = replace_regions(_source(cell), [TEXT_STUB], code=False)
        if cp.cell_type == "code" and cp.clear:
            cell.outputs = []
            cell.execution_count = None
        cell.get("metadata", {}).pop("execution", None)
    return student, the_plan


# --------------------------------------------------------------------------- whole folders


def notebooks_in(folder: str | Path) -> list[Path]:
    """``folder`` itself if it is a notebook, else every notebook in it (not in checkpoints), sorted.

    Any name goes (a student folder need not follow the course's ``NN_topic.ipynb`` names that
    tools/nbtools.py's ``course_notebooks`` lists)."""
    folder = Path(folder)
    if folder.is_file():
        return [folder]
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is neither a notebook nor a folder of notebooks")
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))


def release(source: str | Path, out_dir: str | Path, *, dry_run: bool = False, log=print) -> dict[str, ReleasePlan]:
    """Write the student version of every notebook in ``source`` to ``out_dir``.

    Notebooks without solution regions are copied unchanged. Every notebook is checked before
    anything is written; malformed markers raise :class:`MarkerError` naming the notebook and cell.
    With ``dry_run`` only the plans are returned (and logged).
    """
    import nbformat

    paths = notebooks_in(source)
    out_dir = Path(out_dir)
    if not dry_run and any((out_dir / path.name).resolve() == path.resolve() for path in paths):
        raise ValueError(f"the student versions must go to another folder than {out_dir}: they would overwrite the solutions")
    plans, students, problems = {}, {}, []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        p = plan(nb, path)
        plans[path.name] = p
        if p.problems:
            problems += [f"{path.name}: {problem}" for problem in p.problems]
        elif p.n_regions or any(c.clear for c in p.cells):
            students[path.name] = student_version(nb, path)[0]
        else:
            students[path.name] = nb
        if log:
            if not p.n_regions and not p.checked and not p.problems:
                log(f"{path.name}: no exercises, copied unchanged")
            else:
                log(f"{path.name}:\n  " + p.summary().replace("\n", "\n  "))
    if problems:
        raise MarkerError("malformed solution markers:\n  " + "\n  ".join(problems))
    if not dry_run:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, nb in students.items():
            nbformat.write(nb, out_dir / name)
        if log:
            log(f"wrote {len(students)} student notebook(s) to {out_dir}")
    return plans


# --------------------------------------------------------------------------- nbgrader


def _assert_checks(text: str) -> str:
    """Turn every top-level ``X.check(...)`` expression statement of ``text`` into ``assert X.check(...)``."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.split("\n")
    for node in reversed(tree.body):
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "check":
            line = lines[node.lineno - 1]
            lines[node.lineno - 1] = line[: node.col_offset] + "assert " + line[node.col_offset:]
    return "\n".join(lines)


def _nbgrader_meta(grade_id: str, *, solution: bool, grade: bool, points: float = 0) -> dict[str, Any]:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3, "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return meta


def nbgrader_version(nb: Any, path: str | Path | None = None) -> Any:
    """A copy of the solution notebook ``nb`` ready for an nbgrader course's ``source/`` folder.

    nbgrader needs cell metadata that plain notebooks lack: a solution region must sit in a cell
    marked as a solution ("autograded answer"), and points come from locked test cells that fail by
    raising. So each code cell with solution regions is marked as an answer cell and the exercise
    checks that end it are split off into a locked test cell worth the exercise's points, where
    ``q1.check(f)`` becomes ``assert q1.check(f)``. A check in a later cell (the answer held in a
    variable) becomes that test cell. A markdown solution region becomes a manually graded answer
    worth 0 points. The solutions and everything else are unchanged.
    """
    import nbformat

    from .core import exercise

    the_plan = plan(nb, path)
    if the_plan.problems:
        raise MarkerError("; ".join(the_plan.problems))
    bound = bindings(nb)

    def points(key: str | None) -> float:
        try:
            return exercise(*key.split(".")).points if key else 1
        except ValueError:
            return 1

    def gid(key: str | None, kind: str, index: int) -> str:
        existing = out.cells[index].get("metadata", {}).get("nbgrader", {}).get("grade_id")  # set by mark_answer_cells
        if existing and kind in ("answer", "written"):
            return existing
        return f"ex{key.replace('.', '-')}-{kind}" if key else f"cell{index}-{kind}"

    out = copy.deepcopy(nb)
    cells = []
    graded = set()
    for cp, cell in zip(the_plan.cells, out.cells):
        text = _source(cell)
        if cp.cell_type == "markdown" and cp.regions:
            cell.metadata["nbgrader"] = _nbgrader_meta(gid(cp.answers, "written", cp.index), solution=True, grade=True, points=0)
        elif cp.cell_type == "code" and cp.regions:
            lines = text.split("\n")
            last_end = solution_regions(text)[-1][1]
            hit_lines = [(text[:offset].count("\n"), key) for offset, key in checks_in(text, bound)]
            hit_lines = [(line, key) for line, key in hit_lines if line > last_end]
            cell.metadata["nbgrader"] = _nbgrader_meta(gid(cp.answers, "answer", cp.index), solution=True, grade=False)
            if hit_lines:  # split the trailing checks off into a locked test cell
                first, key = hit_lines[0]
                cell.source = "\n".join(lines[:first]).rstrip("\n")
                test_cell = nbformat.v4.new_code_cell(_assert_checks("\n".join(lines[first:])))
                test_cell.outputs, cell.outputs = cell.get("outputs", []), []  # what the check printed
                test_cell.metadata["nbgrader"] = _nbgrader_meta(gid(key, "check", cp.index), solution=False, grade=True, points=points(key))
                graded.add(key)
                cells += [cell, test_cell]
                continue
        elif cp.cell_type == "code" and cp.checks and not cp.regions:
            key = cp.checks[0]
            if key not in graded:
                cell.source = _assert_checks(text)
                cell.metadata["nbgrader"] = _nbgrader_meta(gid(key, "check", cp.index), solution=False, grade=True, points=points(key))
                graded.add(key)
        cells.append(cell)
    out.cells = cells
    return out


def nbgrader_release(source: str | Path, out_dir: str | Path, *, log=print) -> list[Path]:
    """Write :func:`nbgrader_version` of every notebook with solution regions to ``out_dir``."""
    import nbformat

    out_dir = Path(out_dir)
    written = []
    for path in notebooks_in(source):
        nb = nbformat.read(path, as_version=4)
        if not plan(nb, path).n_regions:
            continue
        if (out_dir / path.name).resolve() == path.resolve():
            raise ValueError(f"write the nbgrader versions to another folder than {path.parent}")
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbgrader_version(nb, path), out_dir / path.name)
        written.append(out_dir / path.name)
        if log:
            log(f"{path.name}: nbgrader source version written")
    return written


# --------------------------------------------------------------------------- nbgrader metadata, in place

#: What ``nbgrader generate_assignment`` needs on a code cell holding solution regions (an
#: "autograded answer" in nbgrader's words; schema v3 requires the four flags, and a grade_id as
#: soon as one of them is true). No points: the course's checks do the scoring.
ANSWER_METADATA = {"grade": False, "locked": False, "schema_version": 3, "solution": True}
_OUR_ID = re.compile(r"^(?:ex\d+-\d+-(?:answer|written)|answer-[\w-]+)(?:-\d+)?$")
_VALID_ID = re.compile(r"^[a-zA-Z0-9_\-]+$")  # nbgrader's grade_id pattern (schema v3), non-empty


def _answer_ok(meta: Any, cell_type: str) -> bool:
    """Whether a region cell's nbgrader metadata already satisfies nbgrader (kept as it is then)."""
    if not isinstance(meta, dict) or meta.get("schema_version") != 3 or not meta.get("solution") or meta.get("locked"):
        return False
    if not _VALID_ID.match(str(meta.get("grade_id", ""))):
        return False
    if cell_type == "markdown" or meta.get("grade"):  # nbgrader: markdown answers are graded; graded cells have points
        return meta.get("grade") is True and isinstance(meta.get("points"), (int, float))
    return meta.get("grade") is False


def mark_answer_cells(nb: Any, path: str | Path | None = None) -> list[str]:
    """Give every cell holding a solution region the nbgrader metadata of an answer cell, in place.

    Code cells get :data:`ANSWER_METADATA` with ``grade_id`` ``"ex03-1-answer"`` (the exercise whose
    check follows the region); markdown cells, which nbgrader only accepts as manually graded
    answers, get ``grade: true, points: 0`` and ``"ex03-1-written"``. Where the exercise is unknown
    the id is ``"answer-<cell id>"``. Ids are unique in the notebook (a ``-2`` suffix where needed).

    Idempotent: metadata that already satisfies nbgrader is kept as it is (so a grade_id, once in an
    nbgrader gradebook, never changes, and an instructor's own points stay). A cell that no longer
    holds a region loses metadata this function wrote (nbgrader would replace the whole cell).
    Nothing but cell metadata is touched. Returns what changed, one line per cell.
    """
    the_plan = plan(nb, path)
    if the_plan.problems:
        raise MarkerError("; ".join(the_plan.problems))
    # the exercise each region answers; a markdown region takes the next check after it
    answers: dict[int, str | None] = {}
    upcoming: str | None = None
    for cp in reversed(the_plan.cells):
        if cp.checks:
            upcoming = next((k for k in cp.checks if k), upcoming)
        if cp.regions:
            answers[cp.index] = cp.answers if cp.cell_type == "code" else (cp.answers or upcoming)

    changes: list[str] = []
    taken: set[str] = set()
    to_mark: list[int] = []
    for cp, cell in zip(the_plan.cells, nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if cp.regions and _answer_ok(meta, cp.cell_type) and meta["grade_id"] not in taken:
            taken.add(meta["grade_id"])
        elif cp.regions:
            to_mark.append(cp.index)
        elif isinstance(meta, dict):
            ours = meta.get("solution") and not meta.get("locked") and _OUR_ID.match(str(meta.get("grade_id", "")))
            if ours and (not meta.get("grade") or meta.get("points") == 0):
                del cell.metadata["nbgrader"]
                changes.append(f"cell {cp.index}: no solution region any more, nbgrader metadata {meta.get('grade_id')!r} removed")
            elif meta.get("grade") or meta.get("solution") or meta.get("locked"):
                taken.add(str(meta.get("grade_id", "")))

    for index in to_mark:
        cell = nb.cells[index]
        key = answers.get(index)
        if key:
            base = f"ex{key.replace('.', '-')}-{'written' if cell.cell_type == 'markdown' else 'answer'}"
        else:
            base = f"answer-{cell.get('id') or index}"
        grade_id, n = base, 1
        while grade_id in taken:
            n += 1
            grade_id = f"{base}-{n}"
        taken.add(grade_id)
        old = cell.setdefault("metadata", {}).get("nbgrader")
        new = dict(ANSWER_METADATA, grade_id=grade_id)
        if cell.cell_type == "markdown":
            new.update(grade=True, points=0)
        elif isinstance(old, dict) and old.get("grade") and isinstance(old.get("points"), (int, float)):
            new.update(grade=True, points=old["points"])  # an instructor made it a graded answer: keep that
        cell.metadata["nbgrader"] = new
        changes.append(f"cell {index}: marked as an nbgrader answer cell, grade_id {grade_id!r}")
    return changes


def _dump(nb: Any) -> str:
    """JSON text as nbformat writes it (so a metadata change is the only diff)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def mark_notebooks(source: str | Path, *, check: bool = False, log=print) -> dict[str, list[str]]:
    """:func:`mark_answer_cells` on every notebook in ``source``, rewriting the files that change.

    The file is read and written as plain JSON in nbformat's layout, so sources, outputs and
    execution counts stay byte for byte. With ``check`` nothing is written. Returns
    {notebook name: changes} for the notebooks that needed (``check``) or got changes.
    """
    import nbformat

    paths = notebooks_in(source)
    pending, problems = {}, []
    for path in paths:
        raw = path.read_text(encoding="utf-8")
        nb = nbformat.from_dict(json.loads(raw))
        try:
            changes = mark_answer_cells(nb, path)
        except MarkerError as error:
            problems.append(f"{path.name}: {error}")
            continue
        if changes:
            nbformat.validate(nb)
            pending[path] = (nb, changes)
    if problems:
        raise MarkerError("malformed solution markers:\n  " + "\n  ".join(problems))
    for path, (nb, changes) in pending.items():
        if not check:
            path.write_text(_dump(nb), encoding="utf-8")
        if log:
            log(f"{path.name}: " + ("would change" if check else "updated") + "\n  " + "\n  ".join(changes))
    if log and not pending:
        log(f"{len(paths)} notebook(s): every solution region already sits in an nbgrader answer cell")
    return {path.name: changes for path, (nb, changes) in pending.items()}
