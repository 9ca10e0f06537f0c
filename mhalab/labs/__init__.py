"""Auto-checked lab exercises: ``q1, q2 = labs.load("03")`` or ``q1 = labs.exercise("03", 1)``.

Each exercise has ``check(answer)``, ``hint()`` and ``solution()``. The exercises of notebook
``NN`` live in ``mhalab/labs/exNN.py``; the machinery in ``mhalab/labs/core.py``; the helpers
checkers use in ``mhalab/labs/checks.py``; the instructor commands (student release, grading)
in ``mhalab/labs/release.py`` and ``mhalab/labs/grade.py`` (run ``python -m mhalab.labs --help``).
"""

from .core import Exercise, Wrong, available_notebooks, exercise, load, outcomes, register, reset, results

__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load", "outcomes", "register", "reset", "results"]
