"""Each exercise's solution and labels are kept once: in its ``Exercise`` (``mhalab/labs/exNN.py``). A notebook's
answer cell holds the same text: the template's ``def`` line, then the solution's body between the solution
markers; the markdown cell that asks the exercise has its heading (``### Exercise K: ...``) followed by the
exercise's label line (difficulty, importance, minutes).

    python tools/solutions.py            # list every answer cell whose solution region differs (exit 1 if any)
    python tools/solutions.py --write    # rewrite those regions, and the label lines, from the exercises
    python tools/solutions.py --write notebooks/07_what_heads_do.ipynb   # only some notebooks
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _expected_cell(source: str, solution: str, where: str) -> str:
    """``source`` with its one solution region replaced by ``solution``'s body (after its ``def`` line, which
    must be the line just before the region)."""
    from mhalab_grader.cells import BEGIN_LINE, END_LINE, solution_regions

    regions = solution_regions(source)
    if len(regions) != 1:
        raise ValueError(f"{where}: expected one solution region, found {len(regions)}")
    (begin, end), lines = regions[0], source.split("\n")
    first, *body = solution.strip("\n").split("\n")
    if begin == 0 or lines[begin - 1].rstrip() != first.rstrip():
        raise ValueError(f"{where}: the line before {BEGIN_LINE!r} must be the solution's first line {first!r}")
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    return "\n".join([*lines[:begin], indent + BEGIN_LINE, *(line.rstrip() for line in body), indent + END_LINE,
                      *lines[end + 1:]])


def solution_problems(write: bool = False, notebooks: list[Path] | None = None) -> list[str]:
    """``notebook: grade_id`` for each answer cell whose region is not its exercise's solution (rewritten if
    ``write``)."""
    from mhalab.labs.core import exercise, parse_grade_id

    problems = []
    for path in notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        changed = False
        for cell in nb["cells"]:
            label = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            parsed = parse_grade_id(label)
            if cell["cell_type"] != "code" or not parsed or parsed[1] != "answer":
                continue
            source = "".join(cell["source"])
            where = f"{path.name}: {label}"
            expected = _expected_cell(source, exercise(*parsed[0].split(".")).solution_text, where)
            if expected != source:
                problems.append(where)
                cell["source"] = expected.splitlines(keepends=True)
                changed = True
        if write and changed:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return problems


HEADING = re.compile(r"^#+ Exercise (\d+)\b.*$", re.M)
LABEL = re.compile(r"^\*Difficulty .*\*$")


def label_problems(write: bool = False, notebooks: list[Path] | None = None) -> list[str]:
    """``notebook: exercise`` for each exercise heading not followed by its label line (written if ``write``)."""
    from mhalab.labs.core import available_notebooks, load

    problems = []
    for path in notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        number = path.name[:2]
        if number not in available_notebooks():
            continue
        exercises = {ex.number: ex for ex in load(number)}
        nb = json.loads(path.read_text())
        changed, seen = False, set()
        for cell in nb["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            lines = "".join(cell["source"]).split("\n")
            for i in range(len(lines) - 1, -1, -1):
                m = HEADING.match(lines[i])
                if not m or int(m.group(1)) not in exercises:
                    continue
                ex = exercises[int(m.group(1))]
                seen.add(ex.number)
                following = lines[i + 1:i + 3] + [""] * 2  # the label, then a blank line (a paragraph of its own)
                if following[0] == ex.label and following[1] == "":
                    continue
                problems.append(f"{path.name}: exercise {ex.key}")
                if LABEL.match(following[0]):
                    del lines[i + 1]
                lines[i + 1:i + 1] = [ex.label] + ([""] if lines[i + 1:i + 2] != [""] else [])
                changed = True
            if changed:
                cell["source"] = "\n".join(lines).splitlines(keepends=True)
        problems += [f"{path.name}: no heading '### Exercise {n}: ...' for exercise {ex.key}"
                     for n, ex in exercises.items() if n not in seen]
        if write and changed:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return problems


def _names(source: str) -> set[str]:
    import ast

    text = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
    try:
        return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def use_problems(write: bool = False, notebooks: list[Path] | None = None) -> list[str]:
    """``notebook: exercise`` for each answer that a later cell calls but whose answer cell does not end with
    ``name = qN.use(name)`` (so a learner copy would raise there until the exercise is done); added if ``write``."""
    from mhalab.labs.core import exercise, parse_grade_id

    problems = []
    for path in notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        changed = False
        for index, cell in enumerate(nb["cells"]):
            parsed = parse_grade_id(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
            if cell["cell_type"] != "code" or not parsed or parsed[1] != "answer":
                continue
            ex = exercise(*parsed[0].split("."))
            name = ex.template[0]
            later = [c for c in nb["cells"][index + 1:] if c["cell_type"] == "code"]
            if not any(name in _names("".join(c["source"])) for c in later):
                continue
            source = "".join(cell["source"]).rstrip("\n")
            check = re.search(r"^(\w+)\.check\(", source, re.M)
            line = f"{name} = {check.group(1)}.use({name})  # yours once it passes, else the course's"
            if source.endswith(line):
                continue
            problems.append(f"{path.name}: exercise {ex.key}")
            cell["source"] = (source + "\n" + line).splitlines(keepends=True)
            changed = True
        if write and changed:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return problems


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write = "--write" in sys.argv[1:]
    chosen = [Path(a) for a in sys.argv[1:] if a != "--write"] or None
    found = (solution_problems(write=write, notebooks=chosen) + label_problems(write=write, notebooks=chosen)
             + use_problems(write=write, notebooks=chosen))
    for name in found:
        print(("rewrote " if write else "differs from its exercise's solution: ") + name)
    sys.exit(0 if write or not found else 1)
