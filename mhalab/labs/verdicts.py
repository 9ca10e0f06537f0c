"""What a check concludes about an answer: the statuses and the two exceptions a checker raises. A leaf module
(it imports nothing), so that everything that judges or runs answers can import it, the grading kernel's
``mhalab.labs`` included (the grader copies it there with the package)."""

from __future__ import annotations

__all__ = ["AnswerRaised", "BROKEN", "ERROR", "FAILED", "PASSED", "STRICT_ENV", "UNANSWERED", "Wrong"]

PASSED, FAILED, UNANSWERED, ERROR, BROKEN = "passed", "failed", "unanswered", "error", "checker error"
STRICT_ENV = "MHALAB_LABS_STRICT"  # set to 1: a failed check raises AssertionError (nbval and nbgrader see it)


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says what is off."""


class AnswerRaised(Wrong):
    """The learner's function raised on a hidden input (reported as an error)."""
