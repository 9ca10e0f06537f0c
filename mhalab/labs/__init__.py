"""Auto-checked lab exercises: ``q1, q2, q3 = labs.load("03")``, then ``q1.check(answer)``, ``hint()``, ``solution()``.

The exercises of notebook NN are in ``exNN.py``; grading is the instructors' distribution ``mhalab-grader``
(``grader/``; ``python -m mhalab_grader --help``).
"""

from .core import Exercise, Wrong, available_notebooks, exercise, load, register

__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load", "register"]
