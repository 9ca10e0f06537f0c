"""The corpus of answers (tests/labs_corpus.py), per exercise: how many right answers (that must pass) and wrong
ones (that must fail, naming their mistake) it holds.

    python tools/corpus_table.py            # the counts
    python tools/corpus_table.py --judge    # and how many get their outcome in q.check now, with the time it took
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from labs_corpus import CORPUS, as_the_corpus_asks  # noqa: E402

import mhalab.labs as labs  # noqa: E402


def judged(key: str) -> tuple[int, int]:
    """How many right answers pass and how many wrong ones fail with their message, in ``q.check``."""
    ex = labs.exercise(*key.split("."))
    right = sum(as_the_corpus_asks("right", "", *ex.verdict(a)) for a in CORPUS[key]["right"])
    wrong = sum(as_the_corpus_asks("wrong", expected, *ex.verdict(a)) for a, expected in CORPUS[key]["wrong"])
    return right, wrong


def main(argv: list[str]) -> int:
    judge = "--judge" in argv
    keys = [ex.key for nb in labs.available_notebooks() for ex in labs.load(nb)]
    print(f"| exercise | right | wrong |{' as expected | seconds |' if judge else ''}")
    print(f"|---|---:|---:|{'---:|---:|' if judge else ''}")
    totals, bad = [0, 0], 0
    for key in keys:
        entry = CORPUS.get(key, {"right": [], "wrong": []})
        n_right, n_wrong = len(entry["right"]), len(entry["wrong"])
        totals[0], totals[1] = totals[0] + n_right, totals[1] + n_wrong
        extra = ""
        if judge:
            start = time.process_time()
            ok_right, ok_wrong = judged(key)
            bad += (n_right - ok_right) + (n_wrong - ok_wrong)
            extra = f" {ok_right}+{ok_wrong} | {time.process_time() - start:.1f} |"
        print(f"| {key} | {n_right} | {n_wrong} |{extra}")
    print(f"| total | {totals[0]} | {totals[1]} |{' | |' if judge else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
