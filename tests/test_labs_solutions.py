"""Each exercise's solution is kept once: every notebook's solution region is its ``Exercise.solution`` text."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from solutions import solution_problems  # noqa: E402


def test_every_solution_region_is_its_exercises_solution():
    problems = solution_problems()
    assert not problems, ("these answer cells differ from their exercise's solution (mhalab/labs/exNN.py); rewrite "
                          f"them with `python tools/solutions.py --write`: {problems}")
