"""Instructor commands for the course's lab exercises (``python -m mhalab_grader --help``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from mhalab.labs.core import available_notebooks, load

from .cells import release
from .grade import grade
from .gradebook import Submission, find_submissions, grade_class, gradescope_results, write_outputs
from .sandbox import Limits, SandboxUnavailable, problem

PROG = "python -m mhalab_grader"


def cmd_release(args: argparse.Namespace) -> int:
    if not args.check and args.out_dir is None:
        sys.exit(f"{PROG} release: give an output folder (release notebooks/ OUT_DIR), or --check to only list")
    release(args.source, args.out_dir or ".", dry_run=args.check)
    return 0


def sandbox_or_refuse(args: argparse.Namespace) -> bool:
    """Say before grading whether the submissions run sandboxed; refuse where no sandbox can be made unless
    told --no-sandbox. True: sandboxed."""
    if args.no_sandbox:
        print("WARNING: --no-sandbox: each submission's code runs as you, with your files and your network",
              file=sys.stderr)
        return False
    why = problem()
    if why:
        raise SandboxUnavailable(why)
    limits = args.limits
    print(f"sandbox: bubblewrap, no network, read-only system, private /tmp of {limits.disk_mb} MB, "
          f"{limits.memory_mb} MB per process, {limits.processes} processes", file=sys.stderr)
    return True


def cmd_grade(args: argparse.Namespace) -> int:
    timeout = args.timeout if args.timeout > 0 else None
    args.limits = Limits(memory_mb=args.memory_mb, processes=args.processes, disk_mb=args.disk_mb)
    sandboxed = sandbox_or_refuse(args)
    folders = [p for p in args.notebooks if Path(p).is_dir()]
    if folders:  # a class in nbgrader's layout
        if len(args.notebooks) > 1:
            sys.exit(f"{PROG} grade: give one folder (nbgrader's submitted/) or notebooks, not both")
        start = time.perf_counter()
        submissions = find_submissions(folders[0], args.assignment)
        # a bar on a terminal (tqdm leaves it out elsewhere); each learner's line above it either way
        with tqdm(total=len(submissions), unit="notebook", desc="grading", file=sys.stderr, disable=None) as bar:
            def progress(line: str) -> None:
                bar.write(line)
                bar.update(1)
            results = grade_class(submissions, source=args.source, timeout=timeout, jobs=args.jobs,
                                  sandboxed=sandboxed, limits=args.limits, progress=progress, fork=not args.no_fork)
        out = Path(args.out or "graded")
        write_outputs(results, out, gradescope=args.gradescope is not None)
        print(f"graded {len(results)} submission(s) in {time.perf_counter() - start:.0f} s with -j {args.jobs}; wrote "
              f"{out / 'gradebook.csv'} and {out / 'feedback'}/"
              + (f" and {out / 'gradescope'}/" if args.gradescope is not None else ""))
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for _, r in results], indent=2, ensure_ascii=False) + "\n")
        return 0
    reports, failed = [], 0
    for notebook in args.notebooks:
        try:
            report = grade(notebook, assignment=args.assignment, source=args.source, timeout=timeout,
                           sandboxed=sandboxed, limits=args.limits)
        except (ValueError, FileNotFoundError) as error:
            print(f"{PROG} grade: {notebook}: {error}", file=sys.stderr)
            failed += 1
            continue
        print(report.format())
        reports.append(report)
    # written only now: grade() returns once every process a submission started is gone
    if args.json and reports:
        data = [asdict(r) for r in reports]
        Path(args.json).write_text(json.dumps(data[0] if len(args.notebooks) == 1 else data, indent=2,
                                              ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    if args.gradescope and reports:
        if len(reports) > 1:
            sys.exit(f"{PROG} grade: --gradescope FILE takes one submission (a class folder writes one per learner)")
        Path(args.gradescope).parent.mkdir(parents=True, exist_ok=True)
        Path(args.gradescope).write_text(json.dumps(gradescope_results(reports[0]), indent=2) + "\n")
    if args.out and reports:
        write_outputs([(Submission(Path(r.notebook).stem, r.notebooks[0], Path(r.notebook)), r) for r in reports],
                      args.out)
    return 1 if failed else 0


def cmd_gradescope(args: argparse.Namespace) -> int:
    from .gradescope import bundle

    path = bundle(args.notebook, args.output, source=args.source, timeout=args.timeout)
    print(f"wrote {path}: upload it as the autograder of notebook {str(args.notebook).zfill(2)} on Gradescope")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for nb_id in args.notebooks or available_notebooks():
        for ex in load(nb_id):
            print(f"{ex.key:<6} {ex.title}  ({ex.points:g} point{'s' if ex.points != 1 else ''})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description="Student releases and grading for the mhalab lab exercises.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="write student versions of the notebooks", description=(
        "In every answer cell (nbgrader metadata, grade_id exNN-K-answer) replace each ### BEGIN SOLUTION ... "
        "### END SOLUTION region by a placeholder, clear the outputs from the first answer cell on, keep the rest."))
    p.add_argument("source", help="a folder of notebooks (e.g. notebooks/) or one notebook")
    p.add_argument("out_dir", nargs="?", help="where the student versions go (must not be the source folder)")
    p.add_argument("--check", "--dry-run", action="store_true", help="only list the answer cells; write nothing")

    p = sub.add_parser("grade", help="score learners' notebooks, one or a whole class", description=(
        "Rebuild each notebook from the instructor's copy with only the submission's answer cells, run it in a "
        "grading kernel where the exercise modules cannot be imported (on Linux in a sandbox: no network, none of "
        "your files, limits on memory, processes, disk and time), call the answers there on hidden inputs "
        "drawn fresh, and judge what they return in this process: passed = the exercise's points, anything else = 0. "
        "The notebook graded as comes from --assignment or the file (or folder) name, never from its contents."))
    p.add_argument("notebooks", nargs="+", metavar="notebook",
                   help="submitted .ipynb files, or one folder in nbgrader's layout "
                   "(submitted/<student>/<assignment>/*.ipynb)")
    p.add_argument("--assignment", metavar="NN",
                   help="the notebook number to grade as (default: from the file or folder name)")
    p.add_argument("--source", metavar="DIR",
                   help="the instructor's solution notebooks (default: the course's notebooks/)")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="grade N submissions at once (a class folder)")
    p.add_argument("--out", metavar="DIR",
                   help="write gradebook.csv and feedback/<student>/<assignment>.html here (a class: default graded/)")
    p.add_argument("--gradescope", nargs="?", const="", metavar="FILE",
                   help="also write Gradescope's results.json: to FILE for one submission; per learner under --out "
                   "for a class")
    p.add_argument("--json", metavar="OUT",
                   help="also write the grade as JSON to OUT (a list when several notebooks are graded)")
    p.add_argument("--timeout", type=float, default=600, metavar="S",
                   help="seconds one cell or one call of an answer may run (default 600; 0 = no limit)")
    p.add_argument("--no-sandbox", action="store_true", help="run submissions as you, unconfined (only for notebooks "
                   "you trust; where no sandbox can be made, macOS and Windows, grading refuses without it)")
    p.add_argument("--no-fork", action="store_true", help="a class: start a fresh kernel per submission that runs the "
                   "whole notebook (default on Linux: run the cells before the first answer cell once, in a sandboxed "
                   "kernel, and fork each submission's kernel from it)")
    p.add_argument("--memory-mb", type=int, default=Limits.memory_mb, metavar="MB", help="memory of each process of a "
                   f"submission (default {Limits.memory_mb})")
    p.add_argument("--processes", type=int, default=Limits.processes, metavar="N",
                   help=f"processes and threads a submission may run at once (default {Limits.processes})")
    p.add_argument("--disk-mb", type=int, default=Limits.disk_mb, metavar="MB",
                   help=f"size of a submission's private /tmp (default {Limits.disk_mb})")

    p = sub.add_parser("gradescope", help="write Gradescope's autograder bundle for one notebook", description=(
        "A zip with setup.sh (installs this course version, a CPU torch and bubblewrap) and run_autograder (grades "
        "/autograder/submission/*.ipynb into /autograder/results/results.json)."))
    p.add_argument("notebook", metavar="NN", help="the notebook number, e.g. 04")
    p.add_argument("-o", "--output", default="autograder.zip", metavar="ZIP", help="where to write it (autograder.zip)")
    p.add_argument("--source", metavar="DIR",
                   help="the instructor's solution notebooks (default: the course's notebooks/)")
    p.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds one cell may run (default 300)")

    p = sub.add_parser("list", help="list the exercises of each notebook")
    p.add_argument("notebooks", nargs="*", help="notebook numbers (default: all)")

    args = parser.parse_args(argv)
    try:
        return {"release": cmd_release, "grade": cmd_grade, "gradescope": cmd_gradescope,
                "list": cmd_list}[args.command](args)
    except (ValueError, FileNotFoundError, SandboxUnavailable) as error:  # bad input (a MarkerError is a ValueError)
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
