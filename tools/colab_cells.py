"""Check (default) or rewrite (--write) every notebook's Colab set-up cell and badge from pyproject.toml's URL.

    python tools/colab_cells.py [--write] [NOTEBOOK ...]     (default: every notebook)
"""

import sys
from pathlib import Path

from nbtools import colab_cell_problems

if __name__ == "__main__":
    write = "--write" in sys.argv[1:]
    paths = [Path(a).resolve() for a in sys.argv[1:] if a != "--write"] or None
    problems = colab_cell_problems(write=write, paths=paths)
    for name in problems:
        print(("rewrote " if write else "stale Colab cell: ") + name)
    sys.exit(0 if write or not problems else 1)
