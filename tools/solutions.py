"""Each exercise's solution is kept once: in its ``Exercise`` (``mhalab/labs/exNN.py``). A notebook's answer cell
holds the same text: the template's ``def`` line, then the solution's body between the solution markers.

    python tools/solutions.py            # list every answer cell whose solution region differs (exit 1 if any)
    python tools/solutions.py --write    # rewrite those regions from the exercises
    python tools/solutions.py --write notebooks/05_what_heads_do.ipynb   # only some notebooks
"""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write = "--write" in sys.argv[1:]
    found = solution_problems(write=write, notebooks=[Path(a) for a in sys.argv[1:] if a != "--write"] or None)
    for name in found:
        print(("rewrote " if write else "differs from its exercise's solution: ") + name)
    sys.exit(0 if write or not found else 1)
