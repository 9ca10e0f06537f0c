"""How long a notebook takes a learner: one model, applied to every notebook.

* reading: the words of its text (every markdown cell) at 150 words a minute: technical prose, read with care;
* code: the non-blank lines of its lesson code at 15 lines a minute (4 s a line: read it, run it, look at what it
  printed or drew); not the folded check cells, the answer cells or the Colab set-up cell;
* exercises: the minutes each of its exercises is labelled with (``Exercise.minutes``);
* running: the processor time of one run of every cell, as ``python3 course.py execute`` last measured it
  (website/notebook_times.json), in whole minutes rounded up.

The total, rounded to 5 minutes, is what each notebook's **Time:** line states; the README states the sum.

The core path and the deep dives: a heading (``#`` to ``###``) that says "deep dive" makes its section a deep dive,
up to the next heading of the same level or above (a notebook's title makes the whole notebook one). Its reading,
code and exercises are counted apart, so each Time line says how much of it is the core path, and the README gives
the core path's hours beside the total. The run time stays with the core (Run All runs the deep dives too), except
in a notebook that is a deep dive as a whole.

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
README_CORE = re.compile(r"(\d+(?:\.5)?) hours on the core path")
HEADING = re.compile(r"^(#{1,3}) ", re.M)
DEEP_DIVE = re.compile(r"deep dive", re.I)


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
    deep_dive: float = 0.0   # the part of reading + code + exercises that lies in deep dives

    @property
    def total(self) -> int:
        return 5 * round((self.reading + self.code + self.exercises + math.ceil(self.run_seconds / 60)) / 5)

    @property
    def deep_dive_total(self) -> int:
        """The deep dives' minutes, to 5 minutes, and never more than the total."""
        return min(self.total, 5 * round(self.deep_dive / 5))

    @property
    def core(self) -> int:
        return self.total - self.deep_dive_total

    def line(self) -> str:
        if self.deep_dive_total == self.total:
            split = ", all of it a deep dive"
        elif self.deep_dive_total:
            split = f": {self.core} on the core path, {self.deep_dive_total} in its deep dives"
        else:
            split = ""
        return (f"**Time:** about {self.total} minutes{split} (reading {round(self.reading)}, "
                f"code {round(self.code)}, exercises {self.exercises}; running every cell takes about "
                f"{describe_run_time(self.run_seconds)} of processor time).")


EXERCISE_HEADING = re.compile(r"^#{2,3} Exercise (\d+)\b", re.M)


def deep_dive_cells(nb: dict) -> list[bool]:
    """For each cell, whether it lies in a deep dive (see the module's docstring)."""
    flags, open_at = [], None   # open_at: the level of the heading that opened the current deep dive
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in _source(cell).split("\n"):
                match = HEADING.match(line)
                if not match:
                    continue
                level = len(match.group(1))
                if open_at is not None and level <= open_at:
                    open_at = None
                if open_at is None and DEEP_DIVE.search(line):
                    open_at = level
        flags.append(open_at is not None)
    return flags


def notebook_minutes(nb: dict, run_seconds: float, exercise_minutes: dict[int, int]) -> Minutes:
    """The model on one notebook. ``exercise_minutes``: each exercise's minutes by its number, which the notebook's
    ``### Exercise N`` headings place in the core or in a deep dive."""
    deep = deep_dive_cells(nb)
    words = [len(_source(c).split()) if c["cell_type"] == "markdown" else 0 for c in nb["cells"]]
    lines = [sum(1 for line in _source(c).split("\n") if line.strip()) if _is_lesson_code(c) else 0
             for c in nb["cells"]]
    deep_numbers = {int(m.group(1)) for c, d in zip(nb["cells"], deep) if d and c["cell_type"] == "markdown"
                    for m in EXERCISE_HEADING.finditer(_source(c))}
    in_deep = (sum(w for w, d in zip(words, deep) if d) / WORDS_PER_MINUTE
               + sum(n for n, d in zip(lines, deep) if d) / CODE_LINES_PER_MINUTE
               + sum(m for k, m in exercise_minutes.items() if k in deep_numbers))
    if deep and all(deep[1:]):  # a notebook that is a deep dive as a whole: its run is the deep dive's too
        in_deep += math.ceil(run_seconds / 60)
    return Minutes(sum(words) / WORDS_PER_MINUTE, sum(lines) / CODE_LINES_PER_MINUTE, sum(exercise_minutes.values()),
                   run_seconds, in_deep)


def minutes_of(path: Path) -> Minutes:
    """The model applied to one notebook of notebooks/, with its last measured run time."""
    import mhalab.labs as labs

    number = path.name[:2]
    exercises = labs.load(number) if number in labs.available_notebooks() else ()
    seconds = json.loads(TIMES.read_text()).get(path.stem, 0.0) if TIMES.exists() else 0.0
    return notebook_minutes(json.loads(path.read_text()), seconds, {ex.number: ex.minutes for ex in exercises})


def _hours(minutes: float) -> float:
    return round(minutes / 30) / 2   # to half an hour


def total_hours(paths: list[Path] | None = None) -> float:
    """The course's total, in hours rounded to half an hour."""
    return _hours(sum(minutes_of(p).total for p in paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))))


def core_hours(paths: list[Path] | None = None) -> float:
    """The core path's total (every notebook without its deep dives), in hours rounded to half an hour."""
    return _hours(sum(minutes_of(p).core for p in paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))))


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
    stated, stated_core = README_TOTAL.search(readme), README_CORE.search(readme)
    hours, core = f"{total_hours():g}", f"{core_hours():g}"
    if not stated or stated.group(2) != hours or not stated_core or stated_core.group(1) != core:
        found.append(README.name)
        if write and stated and stated_core:
            readme = README_TOTAL.sub(lambda m: f"{m.group(1)} {hours} hours in all", readme)
            README.write_text(README_CORE.sub(lambda m: f"{core} hours on the core path", readme))
    return found


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write = "--write" in sys.argv[1:]
    names = stale(write=write)
    print("\n".join(("rewrote " if write else "stale time: ") + n for n in names) or "every stated time is the model's")
    sys.exit(0 if write or not names else 1)
