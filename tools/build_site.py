"""Build the course website from the committed notebooks, without running them (Jupyter Book 1).

Usage (through the course script, which installs the `site` extra first):
    python3 course.py site [OUT]        # default OUT: build/site; open OUT/index.html

Stages ``website/`` (configuration and intro page) with a copy of every course notebook and a table of
contents listing them in order, then runs ``jupyter-book build`` on it and copies the HTML to OUT.
Nothing is executed and nothing is fetched: the pages show the committed outputs, equations are
rendered by a MathJax copied into the site, and search works from the site's own index.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml

from nbtools import ROOT, course_notebooks, repository_url

SITE = ROOT / "website"


def stage(source: Path) -> list[str]:
    """Write the book's sources to ``source``; returns the notebook page names in order."""
    shutil.rmtree(source, ignore_errors=True)
    (source / "notebooks").mkdir(parents=True)
    config = yaml.safe_load((SITE / "_config.yml").read_text())
    config["repository"]["url"] = repository_url()
    (source / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(SITE / "intro.md", source / "intro.md")
    shutil.copytree(SITE / "_ext", source / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    pages = []
    for path in course_notebooks():
        nb = nbformat.read(path, as_version=4)
        # Saved widget state is only useful with the widget JavaScript, which comes from a CDN: leave it
        # out, and let the explorer's still picture (in the same output) show instead.
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, source / "notebooks" / path.name)
        pages.append(f"notebooks/{path.stem}")
    toc = {"format": "jb-book", "root": "intro", "chapters": [{"file": page} for page in pages]}
    (source / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return pages


def build(out: Path) -> Path:
    """Build the website into ``out`` (replaced if it exists; its sources are staged in ``out-source``)."""
    start = time.perf_counter()
    source = out.with_name(out.name + "-source")
    stage(source)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    if not jupyter_book.exists():
        sys.exit("build_site.py: jupyter-book is not installed here; use `python3 course.py site`, which installs it")
    # -W: a warning (a broken reference, a notebook it cannot read) fails the build.
    command = [str(jupyter_book), "build", str(source), "--path-output", str(source), "--builder", "html", "-W"]
    result = subprocess.run(command, cwd=source)
    if result.returncode != 0:
        sys.exit(f"build_site.py: jupyter-book build failed (exit code {result.returncode})")
    html = source / "_build" / "html"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(html, out, ignore=shutil.ignore_patterns(".buildinfo", ".doctrees"))
    (out / ".nojekyll").touch()  # GitHub Pages: serve _static/ and _images/ as they are
    print(f"website built in {time.perf_counter() - start:.0f} s: open {out / 'index.html'}", flush=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_site.py OUT")
    build(Path(sys.argv[1]).resolve())
