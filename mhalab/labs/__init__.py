"""Auto-checked lab exercises: ``q1, q2 = labs.load("03")`` or ``q1 = labs.exercise("03", 1)``.

Each exercise has ``check(answer)``, ``hint()`` and ``solution()``. The exercises of notebook
``NN`` live in ``mhalab/labs/exNN.py``; the machinery in ``mhalab/labs/core.py``.
"""

from .core import Exercise, Wrong, exercise, load, register, results

__all__ = ["Exercise", "Wrong", "exercise", "load", "register", "results"]
