"""The course map (mhalab/course_map.py) is the one source of what the course claims and where: it names every
notebook of notebooks/ in order, its figure's labels neither overlap nor leave the figure, and every place that lists
the notebooks (the README's table, the website's introduction) lists all of them. The start page's glossary names,
for each word, a notebook that uses it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from mhalab import course_map  # noqa: E402
from mhalab.plotting import notebook_style  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from nbtools import course_notebooks  # noqa: E402

START, WRAP_UP = "00_setup", "10_wrap_up"


def test_the_map_names_every_notebook_in_order():
    assert [nb.stem for nb in course_map.NOTEBOOKS] == [p.stem for p in course_notebooks()]
    assert all(nb.stem.startswith(nb.number + "_") for nb in course_map.NOTEBOOKS)


def test_every_claim_points_at_notebooks_and_every_lesson_tests_a_claim():
    numbers = [nb.number for nb in course_map.NOTEBOOKS]
    for claim in course_map.CLAIMS:
        assert claim.notebooks and all(n in numbers for n in claim.notebooks), claim.label
        assert list(claim.notebooks) == sorted(claim.notebooks), claim.label
    lessons = [nb for nb in course_map.NOTEBOOKS if nb.stem not in (START, WRAP_UP)]
    untested = [nb.stem for nb in lessons if not course_map.claims_of(nb.number)]
    assert not untested, f"notebooks that give evidence for no claim of the map: {untested}"
    ends = [nb for nb in course_map.NOTEBOOKS if nb.stem in (START, WRAP_UP)]
    # the start and the wrap-up test nothing
    assert len(ends) == 2 and not any(course_map.claims_of(nb.number) for nb in ends)


def test_every_notebook_but_the_start_page_and_the_wrap_up_has_exercises():
    """The start page and the wrap-up are the only notebooks without exercises: the exemption is theirs alone."""
    import mhalab.labs as labs

    with_exercises = set(labs.available_notebooks())
    for nb in course_map.NOTEBOOKS:
        exempt = nb.stem in (START, WRAP_UP)
        assert (nb.number in with_exercises) != exempt, (
            f"{nb.stem}: " + ("the start page and the wrap-up have no exercises" if exempt else "has no exercises"))
        if not exempt:
            assert labs.load(nb.number), nb.stem


def test_the_map_states_no_measured_number():
    """Each notebook states and checks its own numbers; the map's texts only point at them."""
    texts = [c.label for c in course_map.CLAIMS] + [t for nb in course_map.NOTEBOOKS for t in (nb.evidence, nb.found)]
    numbers = [t for t in texts if re.search(r"\d", re.sub(r"\d·d_model²?|SmolLM2", "", t))]  # formulas, a name
    assert not numbers, numbers


def test_each_notebooks_text_fits_one_line_of_the_map():
    """A text longer than the figure's line would wrap, and could leave a lone word on a line of its own."""
    too_long = [t for nb in course_map.NOTEBOOKS for t in (nb.evidence, nb.found) if len(t) > course_map.WRAP]
    assert not too_long, too_long


@pytest.mark.parametrize("column", ["evidence", "found"])
def test_the_map_figure_has_no_overlapping_or_clipped_label(column):
    notebook_style()
    fig = course_map.plot_course_map(column)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.axes for t in ax.texts]
        outside = [text for text, box in boxes if not fig.bbox.contains(box.x0, box.y0)
                   or not fig.bbox.contains(box.x1, box.y1)]
        assert not outside, f"labels that leave the figure: {outside}"
        overlaps = [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]
        assert not overlaps, f"labels that overlap: {overlaps}"
        shown = {text for text, _ in boxes}
        for nb in course_map.NOTEBOOKS:
            assert f"{nb.number} {nb.title}" in shown
    finally:
        plt.close(fig)


def test_the_readme_and_the_websites_introduction_list_every_notebook():
    readme = (ROOT / "README.md").read_text()
    intro = (ROOT / "website" / "intro.md").read_text()
    stems = [p.stem for p in course_notebooks()]
    in_readme = re.findall(r"^\| \[`(\d\d_\w+)`\]\(learn/\1\.ipynb\)", readme, flags=re.M)
    assert in_readme == stems, "the README's table of notebooks must list every notebook, in order"
    in_intro = re.findall(r"\]\(learn/(\d\d_\w+)\.ipynb\)", intro)
    assert in_intro == stems, "website/intro.md must link every notebook, in order"


def _glossary() -> list[tuple[str, str]]:
    nb = nbformat.read(ROOT / "notebooks" / f"{START}.ipynb", as_version=4)
    text = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## 4. The words"))
    rows = re.findall(r"^\| (.+?) \| .+ \| (\d\d) \|$", text, flags=re.M)
    assert len(rows) > 20, "the start page's glossary table was not found"
    return rows


def test_each_word_of_the_glossary_is_used_in_the_notebook_it_names():
    texts = {p.stem[:2]: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "markdown")
             for p in course_notebooks()}
    missing = []
    for words, number in _glossary():
        first = words.split(",")[0].strip().strip("`")
        if first.lower() not in texts[number].lower():
            missing.append(f"{first!r} is not in notebook {number}'s text")
    assert not missing, missing
