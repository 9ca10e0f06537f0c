"""How long a notebook takes a learner: one model, applied to every notebook.

* reading: the words of its text (every markdown cell) at 150 words a minute: technical prose, read with care;
* code: the non-blank lines of its lesson code at 15 lines a minute (4 s a line: read it, run it, look at what it
  printed or drew); not the folded check cells, the answer cells or the Colab set-up cell;
* exercises: the minutes each of its exercises is labelled with (``Exercise.minutes``);
* running: the processor time of one run of every cell, as ``python3 course.py execute`` last measured it
  (website/notebook_times.json), in whole minutes rounded up.

The total, rounded to 5 minutes, is what each notebook's **Time:** line states; the README states the sum.

    python tools/course_time.py            # list the notebooks (and the README) whose stated time is not the model's
    python tools/course_time.py --write    # rewrite their Time lines and the README's total
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
TIMES = ROOT / "website" / "notebook_times.json"  # seconds of processor time, written by tools/execute_notebooks.py
WORDS_PER_MINUTE = 150
CODE_LINES_PER_MINUTE = 15
TIME_LINE = re.compile(r"^\*\*Time:\*\* .*$", re.M)
README_TOTAL = re.compile(r"([Aa]bout) (\d+(?:\.5)?) hours in all")


def describe_run_time(seconds: float) -> str:
    """'40 s', '1 minute', '1.5 minutes': a run time as a notebook's Time line states it."""
    if seconds < 55:
        return f"{max(10, round(seconds / 10) * 10)} s"
    minutes = round(seconds / 30) / 2
    return "1 minute" if minutes == 1 else f"{minutes:g} minutes"


def _source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def _is_lesson_code(cell: dict) -> bool:
    meta = cell.get("metadata", {})
    return (cell["cell_type"] == "code" and "checks" not in meta.get("tags", []) and "nbgrader" not in meta
            and not _source(cell).startswith("# Colab"))


@dataclass(frozen=True)
class Minutes:
    reading: float
    code: float
    exercises: int
    run_seconds: float

    @property
    def total(self) -> int:
        return 5 * round((self.reading + self.code + self.exercises + math.ceil(self.run_seconds / 60)) / 5)

    def line(self) -> str:
        return (f"**Time:** about {self.total} minutes (reading {round(self.reading)}, code {round(self.code)}, "
                f"exercises {self.exercises}; running every cell takes about {describe_run_time(self.run_seconds)} "
                "of processor time).")


def notebook_minutes(nb: dict, run_seconds: float, exercise_minutes: list[int]) -> Minutes:
    words = sum(len(_source(c).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    lines = sum(1 for c in nb["cells"] if _is_lesson_code(c) for line in _source(c).split("\n") if line.strip())
    return Minutes(words / WORDS_PER_MINUTE, lines / CODE_LINES_PER_MINUTE, sum(exercise_minutes), run_seconds)


def minutes_of(path: Path) -> Minutes:
    """The model applied to one notebook of notebooks/, with its last measured run time."""
    import mhalab.labs as labs

    number = path.name[:2]
    exercises = labs.load(number) if number in labs.available_notebooks() else ()
    seconds = json.loads(TIMES.read_text()).get(path.stem, 0.0) if TIMES.exists() else 0.0
    return notebook_minutes(json.loads(path.read_text()), seconds, [ex.minutes for ex in exercises])


def total_hours(paths: list[Path] | None = None) -> float:
    """The course's total, in hours rounded to half an hour."""
    minutes = sum(minutes_of(p).total for p in paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
    return round(minutes / 30) / 2


def stale(write: bool = False, paths: list[Path] | None = None) -> list[str]:
    """Notebooks (of ``paths``, default all) and the README whose stated time is not the model's; rewritten when
    ``write``."""
    found = []
    for path in paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        opening = _source(nb["cells"][0])
        expected = minutes_of(path).line()
        if TIME_LINE.search(opening) and TIME_LINE.search(opening).group(0) == expected:
            continue
        found.append(path.name)
        if write:
            if not TIME_LINE.search(opening):
                raise ValueError(f"{path.name}: its first cell has no line starting '**Time:**' to rewrite")
            nb["cells"][0]["source"] = TIME_LINE.sub(lambda m: expected, opening).splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = README.read_text()
    stated = README_TOTAL.search(readme)
    hours = f"{total_hours():g}"
    if not stated or stated.group(2) != hours:
        found.append(README.name)
        if write and stated:
            README.write_text(README_TOTAL.sub(lambda m: f"{m.group(1)} {hours} hours in all", readme))
    return found


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write = "--write" in sys.argv[1:]
    names = stale(write=write)
    print("\n".join(("rewrote " if write else "stale time: ") + n for n in names) or "every stated time is the model's")
    sys.exit(0 if write or not names else 1)
