"""Check cells: where a notebook's asserts live, folded away from the lesson.

A lesson reads as prose, code and a figure; the asserts that make every stated number true sit in cells of their
own, after the cells whose results they check. A check cell

* opens with one line saying in words what it checks, ``# @title checks: both ends below the best on every seed``
  (``@title`` is Colab's form syntax: the line is the title its form view shows);
* is folded by default: ``metadata.jupyter.source_hidden`` (JupyterLab), ``metadata.cellView = "form"`` (Colab);
* is tagged ``checks`` (found by the tests) and ``remove-input`` (Jupyter Book leaves its code off the site).

nbval runs every check cell like any other. ``tests/notebook_asserts.txt`` lists every assert of every notebook
(normalised by ``ast.unparse``): a change to that list is a change to what the course claims, and shows in review.

    python tools/check_cells.py              # list the problems (exit 1 if any)
    python tools/check_cells.py --fold       # give every cell whose first line is a check title the metadata
    python tools/check_cells.py --record     # rewrite tests/notebook_asserts.txt from the notebooks
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ASSERTS = ROOT / "tests" / "notebook_asserts.txt"

TAG, SITE_TAG = "checks", "remove-input"
TITLE = re.compile(r"^# @title checks: \S.*$")


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def _python(text: str) -> str:
    """A cell's source with IPython's magics and shell lines made ``pass``, so that ``ast`` can read it."""
    return "\n".join(line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
                     for line in text.split("\n"))


def assert_statements(text: str) -> list[str]:
    """Every ``assert`` in a cell's source (nested ones included), each as ``ast.unparse`` writes it."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(_python(text))) if isinstance(node, ast.Assert)]


def is_check_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def fold(cell: dict) -> None:
    """Give ``cell`` a check cell's metadata (folded in JupyterLab and Colab, its code off the site)."""
    meta = cell.setdefault("metadata", {})
    meta.setdefault("jupyter", {})["source_hidden"] = True
    meta["cellView"] = "form"
    tags = meta.setdefault("tags", [])
    tags += [t for t in (TAG, SITE_TAG) if t not in tags]


def course_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def problems(nb: dict, name: str) -> list[str]:
    """What breaks the check-cell rules in one notebook: an assert outside a check cell, a check cell without
    its title line or its folding."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        if not is_check_cell(cell):
            if assert_statements(text):
                found.append(f"{name} cell {i}: an assert outside a check cell (move it to a check cell below)")
            continue
        meta = cell["metadata"]
        if not TITLE.match(text.split("\n", 1)[0]):
            found.append(f"{name} cell {i}: a check cell's first line says what it checks, "
                         f"'# @title checks: ...'; it is {text.split(chr(10), 1)[0]!r}")
        if not (meta.get("jupyter", {}).get("source_hidden") and meta.get("cellView") == "form"
                and SITE_TAG in meta.get("tags", [])):
            found.append(f"{name} cell {i}: a check cell is folded (run `python tools/check_cells.py --fold`)")
    return found


def all_asserts(paths: list[Path] | None = None) -> list[str]:
    """``"NN: assert ..."`` for every assert of every notebook, sorted (the multiset the tests compare)."""
    lines = []
    for path in paths or course_notebooks():
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                lines += [f"{path.name[:2]}: {a}" for a in assert_statements(source(cell))]
    return sorted(lines)


def recorded_asserts() -> list[str]:
    return sorted(line for line in ASSERTS.read_text().split("\n") if line and not line.startswith("#"))


def _meaning(line: str) -> str:
    """``"NN: assert ..."`` as its notebook and syntax tree, so that two Pythons whose ``ast.unparse`` write the
    same assert differently (3.10 keeps a generator argument's own parentheses, 3.11 drops them) agree."""
    notebook, _, text = line.partition(": ")
    return notebook + ": " + ast.dump(ast.parse(text))


def _unmatched(lines: list[str], others: list[str]) -> list[str]:
    """The lines of ``lines`` whose meaning ``others`` lacks, counted as a multiset."""
    spare = Counter(map(_meaning, others))
    left = []
    for line in lines:
        if spare[_meaning(line)] > 0:
            spare[_meaning(line)] -= 1
        else:
            left.append(line)
    return left


def assert_changes() -> tuple[list[str], list[str]]:
    """(asserts recorded but no longer in the notebooks, asserts in the notebooks but not recorded)."""
    now, then = all_asserts(), recorded_asserts()
    return _unmatched(then, now), _unmatched(now, then)


HEADER = ("# Every assert of every notebook, as ast.unparse writes it, sorted: written by\n"
          "#   python tools/check_cells.py --record\n"
          "# and compared by tests/test_check_cells.py. A change here is a change to what the course claims.\n")


def main(argv: list[str]) -> int:
    if "--fold" in argv:
        for path in course_notebooks():
            nb = json.loads(path.read_text())
            changed = False
            for cell in nb["cells"]:
                if cell["cell_type"] == "code" and TITLE.match(source(cell).split("\n", 1)[0]):
                    before = json.dumps(cell["metadata"], sort_keys=True)
                    fold(cell)
                    changed |= before != json.dumps(cell["metadata"], sort_keys=True)
            if changed:
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
                print(f"folded the check cells of {path.name}")
    if "--record" in argv:
        ASSERTS.write_text(HEADER + "\n".join(all_asserts()) + "\n")
        print(f"wrote {ASSERTS.relative_to(ROOT)}")
    if "--fold" in argv or "--record" in argv:
        return 0
    found = [p for path in course_notebooks() for p in problems(json.loads(path.read_text()), path.name)]
    gone, new = assert_changes()
    found += [f"an assert no longer in the notebooks: {a}" for a in gone]
    found += [f"an assert not in {ASSERTS.name}: {a}" for a in new]
    print("\n".join(found) or "every assert is in a folded check cell, and the list of asserts is unchanged")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
