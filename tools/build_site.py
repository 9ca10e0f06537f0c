"""Build the course website from the committed learner copies (learn/), without running them (Jupyter Book 1).

Usage (through the course script, which installs the `site` extra first):
    python3 course.py site [OUT]        # default OUT: build/site; open OUT/index.html

Stages ``website/`` (configuration and intro page) with every learner copy (exercises left to do, so that the
pages show no solution and their launch buttons open the copy a learner works in) and a table of contents listing
them in order; the check cells' code is left off the pages (their ``remove-input`` tag). Then runs
``jupyter-book build`` on it and copies the HTML to OUT.
Nothing is executed and nothing is fetched: the pages show the committed outputs, equations are
rendered by a MathJax copied into the site, and search works from the site's own index.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml
from nbtools import LEARNER_COPIES, ROOT, course_notebooks, repository_url

SITE = ROOT / "website"
GUIDES = ("learners", "contributors")  # copied as they are; instructors.md gets the course map added
TIMES = SITE / "notebook_times.json"  # seconds per notebook, written by tools/execute_notebooks.py
COLAB_BADGE = re.compile(r" ?\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")


def objectives(nb) -> list[str]:
    """What a notebook's opening cell says the learner can do afterwards (its "**After this notebook you can**"
    list), or else its numbered plan ("1. computes scaled dot-product attention ...")."""
    text = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    goals = re.search(r"\*\*After this notebook you can\*\*(.*?)(?:\n\s*\n|\Z)", text, flags=re.S)
    if goals:
        bullets = re.split(r"\n\s*-\s+", "\n" + goals.group(1).strip())
        found = [" ".join(b.split()) for b in bullets if b.strip()]
        if found:
            return found
    items = re.findall(r"^\s*\d+\.\s+(.*(?:\n(?!\s*\d+\.\s|\s*$).*)*)", text, flags=re.M)
    return [" ".join(line.strip() for line in item.split("\n")) for item in items]


def _answer_text(answer) -> str:
    """A wrong answer of the corpus as code a reader recognises: the lambda, or the function's name and comment."""
    try:
        source = inspect.getsource(answer)
    except (TypeError, OSError):
        return repr(answer)[:120]
    if getattr(answer, "__name__", "") == "<lambda>":
        found = re.search(r"lambda[^:]*:.*", source.strip())
        text = found.group(0) if found else source.strip()
        return re.sub(r',\s*"[^"]*"\)?,?\s*(#.*)?$', "", text).strip()
    first = source.split("\n", 1)[0]
    comment = first.split("#", 1)[1].strip() if "#" in first else ""
    return f"{answer.__name__}" + (f" ({comment})" if comment else "")


def _cell(text: str) -> str:
    """``text`` as one table cell, shown as written: a message's *stress* and `code` are not markdown here."""
    for char in "\\*_`|<[":
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")


def instructors_page() -> str:
    """website/instructors.md with the course map (times, objectives, exercises, points) and the common
    wrong answers with the message each gets (tests/labs_corpus.py, judged now)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from labs_corpus import CORPUS

    import mhalab.labs as labs

    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    lines = ["## The course map", "",
             "Times are the processor time of one run of the whole notebook "
             "(`python3 course.py execute` records them); "
             "the points are what `python -m mhalab_grader grade` gives for a passed exercise.", ""]
    mistakes = ["## Common wrong answers and what the check says", "",
                "Each row is a wrong answer the course's tests hand in, and the message the learner gets for it.", ""]
    for path in course_notebooks():
        nb = nbformat.read(path, as_version=4)
        title = next((c.source.split("\n", 1)[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"),
                     path.stem)
        seconds = times.get(path.stem)
        run_time = f"{seconds:.0f} s of processor time" if seconds else "not measured yet (`python3 course.py execute`)"
        page = f"{LEARNER_COPIES.name}/{path.stem}.ipynb"
        lines += [f"### {title}", "", f"[the notebook]({page}) · run time {run_time}", ""]
        lines += [f"- {goal}" for goal in objectives(nb)] + [""]
        number = path.name[:2]
        exercises = labs.load(number) if number in labs.available_notebooks() else ()
        if exercises:
            lines += ["| exercise | | points |", "|---|---|---|"]
            lines += [f"| {ex.key} | {_cell(ex.title)} | {ex.points:g} |" for ex in exercises]
            lines.append(f"| | total | {sum(ex.points for ex in exercises):g} |")
            lines.append("")
        for ex in exercises:
            rows = []
            for answer, _ in CORPUS.get(ex.key, {}).get("wrong", []):
                status, message = ex.verdict(answer)
                code = _answer_text(answer)[:140].replace("`", "'").replace("|", "\\|").replace("\n", " ")
                rows.append(f"| `{code}` | {_cell(message)} |")
            if rows:
                mistakes += [f"### {ex.key} {ex.title}", "", "| the answer | the message |", "|---|---|", *rows, ""]
    text = (SITE / "instructors.md").read_text()
    return text.replace("<!-- course map -->", "\n".join(lines + mistakes))


def stage(source: Path) -> list[str]:
    """Write the book's sources to ``source``; returns the notebook page names in order."""
    shutil.rmtree(source, ignore_errors=True)
    (source / LEARNER_COPIES.name).mkdir(parents=True)
    config = yaml.safe_load((SITE / "_config.yml").read_text())
    config["repository"]["url"] = repository_url()
    (source / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for guide in GUIDES + ("intro",):
        shutil.copy(SITE / f"{guide}.md", source / f"{guide}.md")
    (source / "instructors.md").write_text(instructors_page())
    shutil.copytree(SITE / "_ext", source / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    pages = []
    for path in (LEARNER_COPIES / p.name for p in course_notebooks()):
        nb = nbformat.read(path, as_version=4)
        # Saved widget state is only useful with the widget JavaScript, which comes from a CDN: leave it
        # out, and let the explorer's still picture (in the same output) show instead.
        nb.metadata.pop("widgets", None)
        # The Colab badge is an image from Colab's site: the pages load nothing from the network, and have
        # launch buttons of their own.
        nb.cells[0].source = COLAB_BADGE.sub("", nb.cells[0].source, count=1)
        nbformat.write(nb, source / LEARNER_COPIES.name / path.name)
        pages.append(f"{LEARNER_COPIES.name}/{path.stem}")
    toc = {"format": "jb-book", "root": "intro", "chapters": [{"file": page} for page in pages]
                                                   + [{"file": guide} for guide in ("instructors", *GUIDES)]}
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
