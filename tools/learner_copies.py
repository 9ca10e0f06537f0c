"""The learner copies in learn/: what a learner opens (`python3 course.py lab`, each notebook's Colab badge, the
site's launch buttons, Binder). Each is its notebook in notebooks/ as the instructors' release makes it
(``mhalab_grader.cells.student_version``): every answer region left to do, the answer cells' outputs cleared.
notebooks/ stays the one source: CI runs it with nbval and instructors edit it; `python3 course.py execute`
rewrites the copies after running a notebook, and tests/test_learner_copies.py fails when one is stale.

    python tools/learner_copies.py            # list the copies that differ from what release makes (exit 1 if any)
    python tools/learner_copies.py --write    # write them all
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS, LEARN = ROOT / "notebooks", ROOT / "learn"


def learner_copy_text(path: Path) -> str:
    """The learner copy of ``path`` as the file it is committed as."""
    from mhalab_grader.cells import student_version

    return nbformat.writes(student_version(nbformat.read(path, as_version=4))) + "\n"


def stale(write: bool = False, paths: list[Path] | None = None) -> list[str]:
    """The copies (of ``paths``, default all) that are missing, differ from what release makes of their notebook,
    or have no notebook."""
    sources = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    found = []
    for path in paths or sources:
        target, text = LEARN / path.name, learner_copy_text(path)
        if not target.exists() or target.read_text() != text:
            found.append(target.name)
            if write:
                LEARN.mkdir(exist_ok=True)
                target.write_text(text)
    for orphan in sorted(set(p.name for p in LEARN.glob("*.ipynb")) - {p.name for p in sources}):
        found.append(orphan)
        if write:
            (LEARN / orphan).unlink()
    return found


if __name__ == "__main__":
    write = "--write" in sys.argv[1:]
    names = stale(write=write)
    print("\n".join(("wrote " if write else "stale: ") + n for n in names) or "every learner copy is current")
    sys.exit(0 if write or not names else 1)
