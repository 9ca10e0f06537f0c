"""Instructor commands for the course's lab exercises.

    python -m mhalab.labs release notebooks/ OUT_DIR      write student versions (solutions -> placeholders)
    python -m mhalab.labs release --check notebooks/      only list what release would change
    python -m mhalab.labs grade SUBMISSION.ipynb [...] [--json out.json] [--timeout S]
    python -m mhalab.labs nbgrader --mark notebooks/      mark the answer cells for nbgrader, in place (--check: only list)
    python -m mhalab.labs nbgrader notebooks/ OUT_DIR     write nbgrader copies with checks split into autograded test cells
    python -m mhalab.labs list [NN ...]                   the exercises of each notebook
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        sys.exit(f"mhalab.labs: this command needs {module}; install it with `pip install 'mhalab[test]'` (or `pip install {module}`)")


def cmd_release(args: argparse.Namespace) -> int:
    _need("nbformat")
    from .release import MarkerError, release

    if not args.check and args.out_dir is None:
        sys.exit("mhalab.labs release: give an output folder (release notebooks/ OUT_DIR), or --check to only list the changes")
    try:
        release(args.source, args.out_dir or ".", dry_run=args.check)
    except (MarkerError, ValueError, FileNotFoundError) as error:
        print(f"mhalab.labs release: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    _need("nbformat")
    _need("nbclient")
    import json

    from .grade import grade

    if args.executed and len(args.notebooks) > 1:
        sys.exit("mhalab.labs grade: --executed saves one notebook; grade one submission at a time with it")
    reports, failed = [], 0
    for notebook in args.notebooks:
        if not Path(notebook).is_file():
            print(f"mhalab.labs grade: no notebook at {notebook}", file=sys.stderr)
            failed += 1
            continue
        try:
            report = grade(
                notebook,
                timeout=args.timeout if args.timeout and args.timeout > 0 else None,
                kernel_name=args.kernel,
                notebook=args.exercises_of,
                executed_path=args.executed,
            )
        except ValueError as error:
            print(f"mhalab.labs grade: {error}", file=sys.stderr)
            failed += 1
            continue
        print(report.format())
        reports.append(report.to_dict())
    if args.json and reports:
        data = reports[0] if len(args.notebooks) == 1 else reports
        Path(args.json).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    return 1 if failed else 0


def cmd_nbgrader(args: argparse.Namespace) -> int:
    _need("nbformat")
    from .release import MarkerError, mark_notebooks, nbgrader_release

    if args.mark and args.out_dir is not None:
        sys.exit("mhalab.labs nbgrader: --mark edits the notebooks in place; give no output folder")
    if not args.mark and args.check:
        sys.exit("mhalab.labs nbgrader: --check goes with --mark (it lists the answer cells that lack nbgrader metadata)")
    if not args.mark and args.out_dir is None:
        sys.exit("mhalab.labs nbgrader: give an output folder (nbgrader notebooks/ OUT_DIR), or --mark to mark the notebooks in place")
    try:
        if args.mark:
            changed = mark_notebooks(args.source, check=args.check)
            return 1 if args.check and changed else 0
        nbgrader_release(args.source, args.out_dir)
    except (MarkerError, ValueError, FileNotFoundError) as error:
        print(f"mhalab.labs nbgrader: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .core import available_notebooks, load

    for nb_id in args.notebooks or available_notebooks():
        for ex in load(nb_id):
            print(f"{ex.key:<6} {ex.title}  ({ex.points:g} point{'s' if ex.points != 1 else ''})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhalab.labs", description="Student releases and grading for the mhalab lab exercises.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="write student versions of the notebooks", description=(
        "Replace every ### BEGIN SOLUTION ... ### END SOLUTION region with a NotImplementedError placeholder, "
        "clear the outputs of the exercise section, keep everything else."))
    p.add_argument("source", help="a folder of notebooks (e.g. notebooks/) or one notebook")
    p.add_argument("out_dir", nargs="?", help="where the student versions go (must not be the source folder)")
    p.add_argument("--check", "--dry-run", action="store_true", help="only list what would change; write nothing")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("grade", help="run a learner's notebook and score its exercises", description=(
        "Execute the notebook in a fresh kernel (continuing past errors), then score every exercise the "
        "registry has for it: passed = its points, anything else = 0."))
    p.add_argument("notebooks", nargs="+", metavar="notebook", help="the submitted .ipynb (several: graded one after the other)")
    p.add_argument("--json", metavar="OUT", help="also write the grade as JSON to OUT (a list when several notebooks are graded)")
    p.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds one cell may run before it is interrupted (default 600; 0 = no limit)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel to run it with (default python3)")
    p.add_argument("--notebook", dest="exercises_of", metavar="NN", help="whose exercises to expect (default: from its labs.load call or file name)")
    p.add_argument("--executed", metavar="OUT.ipynb", help="also save the executed notebook (feedback for the learner)")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("nbgrader", help="prepare the notebooks for an nbgrader course", description=(
        "With --mark: give every cell holding a solution region the cell metadata nbgrader needs (an answer cell, "
        "grade_id like ex03-1-answer), in place, changing nothing else; then the notebooks go into an nbgrader "
        "course's source/<assignment>/ folder unchanged. Idempotent; --check only lists and exits 1 if a notebook "
        "needs marking. Without --mark: copy every notebook with solution regions to OUT_DIR with answer cells marked "
        "and each exercise check split into a locked test cell (assert q.check(...)) worth the exercise's points."))
    p.add_argument("source", help="a folder of notebooks (e.g. notebooks/) or one notebook")
    p.add_argument("out_dir", nargs="?", help="where the nbgrader copies go (not with --mark)")
    p.add_argument("--mark", action="store_true", help="mark the answer cells in place instead of writing copies")
    p.add_argument("--check", action="store_true", help="with --mark: only list what would change; exit 1 if anything would")
    p.set_defaults(func=cmd_nbgrader)

    p = sub.add_parser("list", help="list the exercises of each notebook")
    p.add_argument("notebooks", nargs="*", help="notebook numbers (default: all)")
    p.set_defaults(func=cmd_list)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
