"""Each exercise's solution is kept once: every notebook's solution region is its ``Exercise.solution`` text."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from solutions import label_problems, solution_problems, use_problems  # noqa: E402


def test_every_solution_region_is_its_exercises_solution():
    problems = solution_problems()
    assert not problems, ("these answer cells differ from their exercise's solution (mhalab/labs/exNN.py); rewrite "
                          f"them with `python tools/solutions.py --write`: {problems}")


def test_every_exercise_heading_is_followed_by_its_label():
    problems = label_problems()
    assert not problems, f"rewrite the label lines with `python tools/solutions.py --write`: {problems}"


def test_every_answer_a_later_cell_calls_goes_through_use():
    """Until the learner's answer passes, the cells after it run on the course's (a learner copy runs to its end)."""
    problems = use_problems()
    assert not problems, f"add the q.use line with `python tools/solutions.py --write`: {problems}"
