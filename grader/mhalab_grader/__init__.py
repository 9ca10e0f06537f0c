"""The grader of the mhalab course (a distribution of its own, for instructors: ``pip install ./grader``):
student releases, grading submissions in a sandbox, the class gradebook. ``python -m mhalab_grader --help``.

The exercises it judges (``Exercise``, checks, hints, solutions, references) are in ``mhalab.labs``, what
learners install; nothing there imports this package.
"""

from .grade import ExerciseGrade, GradeReport, grade
from .gradebook import find_submissions, grade_class
from .sandbox import Limits, SandboxUnavailable

__all__ = ["ExerciseGrade", "GradeReport", "Limits", "SandboxUnavailable", "find_submissions", "grade", "grade_class"]
