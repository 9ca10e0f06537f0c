"""Auto-checked lab exercises: ``q1, q2, q3 = labs.load("03")`` or ``q1 = labs.exercise("03", 1)``.

Each exercise has ``check(answer)``, ``hint()`` and ``solution()``. The exercises of notebook ``NN`` live in
``mhalab/labs/exNN.py``; the machinery in ``core.py``; the tolerance policy and the helpers checkers use in
``checks.py``; the instructor commands (student release, grading) in ``release.py`` and ``grade.py``
(run ``python -m mhalab.labs --help``).
"""

from .core import Exercise, Wrong, available_notebooks, exercise, load, register

__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load", "register"]
