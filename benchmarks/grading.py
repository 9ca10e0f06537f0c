"""Submissions graded per minute by ``python -m mhalab_grader grade`` (issue 22).

Two classes, each graded with ``-j`` at a time:

    fixture   tests/labs_fixture.py's class (correct, wrong, crashing, endless, forged, relabelled...):
              the grader's own cost (a grading kernel per submission: start, torch, IPython, the calls)
              plus the time limits the endless ones run into
    course    copies of a course notebook's solution (default 03): what an instructor's class costs,
              dominated by running the notebook's own cells

    python benchmarks/grading.py                           # both, -j 2, about 5 minutes on 2 cores
    python benchmarks/grading.py --only course --notebook 01 --copies 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.append(str(ROOT / "grader"))  # the grader, where the environment predates its distribution

import nbformat  # noqa: E402

from labs_fixture import build_class, synthetic_notebook  # noqa: E402  (registers notebook "99")
from mhalab_grader.gradebook import find_submissions, grade_class  # noqa: E402


def run(folder: Path, source: Path, jobs: int, timeout: float) -> tuple[int, float, list]:
    submissions = find_submissions(folder)
    start = time.perf_counter()
    results = grade_class(submissions, source=source, timeout=timeout, jobs=jobs, progress=None)
    return len(submissions), time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--only", choices=("fixture", "course"))
    parser.add_argument("--notebook", default="03", help="the course notebook of the 'course' class")
    parser.add_argument("--copies", type=int, default=4, help="submissions in the 'course' class")
    parser.add_argument("--timeout", type=float, default=10, help="per-cell limit for the fixture class")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, -j {args.jobs}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.only in (None, "fixture"):
            build_class(tmp / "fixture")
            (tmp / "source").mkdir()
            nbformat.write(synthetic_notebook(), tmp / "source" / "99_fixture.ipynb")
            n, seconds, _ = run(tmp / "fixture", tmp / "source", args.jobs, args.timeout)
            print(f"fixture: {n} submissions in {seconds:.0f} s = {60 * n / seconds:.1f} per minute")
        if args.only in (None, "course"):
            path = next((ROOT / "notebooks").glob(f"{args.notebook}_*.ipynb"))
            for i in range(args.copies):
                target = tmp / "course" / "submitted" / f"learner{i}" / args.notebook / path.name
                target.parent.mkdir(parents=True)
                shutil.copy(path, target)
            n, seconds, results = run(tmp / "course", ROOT / "notebooks", args.jobs, 600)
            scores = sorted({r.score for _, r in results})
            print(f"course ({path.name}): {n} submissions in {seconds:.0f} s = {60 * n / seconds:.2f} per minute "
                  f"(scores {scores})")


if __name__ == "__main__":
    main()
