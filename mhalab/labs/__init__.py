"""Auto-checked lab exercises: ``q1, q2, q3 = labs.load("04")``, then ``q1.check(answer)``, ``hint()``, ``solution()``.

The exercises of notebook NN are in ``exNN.py``; grading is the instructors' distribution ``mhalab-grader``
(``grader/``; ``python -m mhalab_grader --help``), which gives ``Exercise.verdict`` its own runner.
"""

from .core import Exercise, available_notebooks, exercise, load, register
from .verdicts import Wrong

__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load", "register"]
