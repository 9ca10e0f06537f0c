"""Check (default) or rewrite (--write) every notebook's Colab set-up cell from pyproject.toml's URL."""

import sys

from nbtools import colab_cell_problems

if __name__ == "__main__":
    write = "--write" in sys.argv[1:]
    problems = colab_cell_problems(write=write)
    for name in problems:
        print(("rewrote " if write else "stale Colab cell: ") + name)
    sys.exit(0 if write or not problems else 1)
