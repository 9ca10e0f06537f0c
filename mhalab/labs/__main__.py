"""Instructor commands for the course's lab exercises (``python -m mhalab.labs --help``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .core import available_notebooks, load
from .grade import grade, release


def cmd_release(args: argparse.Namespace) -> int:
    if not args.check and args.out_dir is None:
        sys.exit("mhalab.labs release: give an output folder (release notebooks/ OUT_DIR), or --check to only list")
    release(args.source, args.out_dir or ".", dry_run=args.check)
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    if args.executed and len(args.notebooks) > 1:
        sys.exit("mhalab.labs grade: --executed saves one notebook; grade one submission at a time with it")
    reports, failed = [], 0
    for notebook in args.notebooks:
        try:
            report = grade(notebook, timeout=args.timeout if args.timeout > 0 else None,
                           kernel_name=args.kernel, executed_path=args.executed)
        except (ValueError, FileNotFoundError) as error:
            print(f"mhalab.labs grade: {notebook}: {error}", file=sys.stderr)
            failed += 1
            continue
        print(report.format())
        reports.append(asdict(report))
    if args.json and reports:
        data = reports[0] if len(args.notebooks) == 1 else reports
        Path(args.json).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace) -> int:
    for nb_id in args.notebooks or available_notebooks():
        for ex in load(nb_id):
            print(f"{ex.key:<6} {ex.title}  ({ex.points:g} point{'s' if ex.points != 1 else ''})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhalab.labs", description="Student releases and grading for the mhalab lab exercises.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="write student versions of the notebooks", description=(
        "In every answer cell (nbgrader metadata, grade_id exNN-K-answer) replace each ### BEGIN SOLUTION ... "
        "### END SOLUTION region by a placeholder, clear the outputs from the first answer cell on, keep the rest."))
    p.add_argument("source", help="a folder of notebooks (e.g. notebooks/) or one notebook")
    p.add_argument("out_dir", nargs="?", help="where the student versions go (must not be the source folder)")
    p.add_argument("--check", "--dry-run", action="store_true", help="only list the answer cells; write nothing")

    p = sub.add_parser("grade", help="run a learner's notebook and score its exercises", description=(
        "Execute the notebook in a fresh kernel (continuing past errors), collect the answers, and judge them in "
        "this process: passed = the exercise's points, anything else = 0."))
    p.add_argument("notebooks", nargs="+", metavar="notebook", help="the submitted .ipynb (several: graded one after the other)")
    p.add_argument("--json", metavar="OUT", help="also write the grade as JSON to OUT (a list when several notebooks are graded)")
    p.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds one cell may run (default 600; 0 = no limit)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel to run it with (default python3)")
    p.add_argument("--executed", metavar="OUT.ipynb", help="also save the executed notebook (feedback for the learner)")

    p = sub.add_parser("list", help="list the exercises of each notebook")
    p.add_argument("notebooks", nargs="*", help="notebook numbers (default: all)")

    args = parser.parse_args(argv)
    try:
        return {"release": cmd_release, "grade": cmd_grade, "list": cmd_list}[args.command](args)
    except (ValueError, FileNotFoundError) as error:  # bad input (a MarkerError is a ValueError): no traceback
        print(f"mhalab.labs {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
