"""Submissions graded per minute by ``python -m mhalab_grader grade``, by both paths side by side (issues 22, 31).

    fresh   a fresh sandboxed grading kernel per submission, which runs the whole notebook (``--no-fork``)
    fork    one prepared kernel per assignment runs the instructor's cells before the first answer cell, and
            each submission's kernel is a fork of it that runs the rest (the default on Linux)

Classes, each graded with ``-j`` at a time by both paths (the fork path's time includes preparing):

    fixture   tests/labs_fixture.py's class (correct, wrong, crashing, endless, forged, relabelled...): the
              grader's own cost plus the time limits the endless ones run into
    NN        copies of course notebook NN's solution (``--copies``; the fresh path grades the first
              ``--fresh-copies`` of them when it would take too long)

    python benchmarks/grading.py                                  # fixture, 04 and 07, 20 copies, -j 2
    python benchmarks/grading.py --notebooks 04 --copies 4
"""

from __future__ import annotations

import argparse
import json
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


def run(folder: Path, source: Path, *, jobs: int, timeout: float, fork: bool, limit: int | None = None) -> dict:
    """Grade the class in ``folder`` (its first ``limit`` submissions) by one path: rate, times, scores."""
    submissions = find_submissions(folder)[:limit]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    results = grade_class(submissions, source=source, timeout=timeout, jobs=jobs, progress=None, fork=fork)
    seconds = time.perf_counter() - start
    each = [r.elapsed_s for _, r in results]
    return {"path": "fork" if fork else "fresh", "n": len(results), "seconds": round(seconds, 1),
            "per_minute": round(60 * len(results) / seconds, 2), "mean_submission_s": round(sum(each) / len(each), 1),
            "load": [round(load, 1), round(os.getloadavg()[0], 1)],
            "scores": {s.student: r.score for s, r in results}}


def compare(name: str, fork: dict, fresh: dict) -> dict:
    same = all(fork["scores"][s] == score for s, score in fresh["scores"].items())
    line = {"class": name, "fork": fork, "fresh": fresh, "ratio": round(fork["per_minute"] / fresh["per_minute"], 1),
            "same_scores": same}
    for r in (fresh, fork):
        print(f"{name:>8} {r['path']:>5}: {r['n']} submissions in {r['seconds']:.0f} s = "
              f"{r['per_minute']:.2f} per minute "
              f"({r['mean_submission_s']:.1f} s each after preparing; load {r['load'][0]} -> {r['load'][1]})",
              flush=True)
    print(f"{name:>8} ratio fork/fresh {line['ratio']}, same scores: {same}", flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--notebooks", nargs="*", default=["05", "08"],
                        help="course notebooks (none: the fixture only)")
    parser.add_argument("--copies", type=int, default=20, help="submissions of each course notebook")
    parser.add_argument("--fresh-copies", type=int, help="how many of them the fresh path grades (default: all)")
    parser.add_argument("--no-fixture", action="store_true")
    parser.add_argument("--timeout", type=float, default=10, help="per-cell limit for the fixture class")
    parser.add_argument("--json", metavar="OUT", help="also write the measurements as JSON")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, -j {args.jobs}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not args.no_fixture:
            build_class(tmp / "fixture")
            (tmp / "source").mkdir()
            nbformat.write(synthetic_notebook(), tmp / "source" / "99_fixture.ipynb")
            both = [run(tmp / "fixture", tmp / "source", jobs=args.jobs, timeout=args.timeout, fork=f) for f in (True,
                                                                                                                 False)]
            lines.append(compare("fixture", *both))
        for nb_id in args.notebooks:
            path = next((ROOT / "notebooks").glob(f"{nb_id}_*.ipynb"))
            for i in range(args.copies):
                target = tmp / nb_id / "submitted" / f"learner{i:02d}" / nb_id / path.name
                target.parent.mkdir(parents=True)
                shutil.copy(path, target)
            fork = run(tmp / nb_id, ROOT / "notebooks", jobs=args.jobs, timeout=600, fork=True)
            fresh = run(tmp / nb_id, ROOT / "notebooks", jobs=args.jobs, timeout=600, fork=False,
                        limit=args.fresh_copies)
            lines.append(compare(nb_id, fork, fresh))
    if args.json:
        Path(args.json).write_text(json.dumps(lines, indent=1) + "\n")


if __name__ == "__main__":
    main()
