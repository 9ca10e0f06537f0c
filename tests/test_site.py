"""The course website (`python3 course.py site`): built from the committed notebooks without running them,
every notebook has its page with its figures, no internal link is broken, nothing comes from the
network, and in a browser the equations render (local MathJax), the figures load and search answers.

Builds the site once per module (about half a minute). Needs the `site` extra (Jupyter Book 1), which
`python3 course.py test` installs; elsewhere the tests are skipped, except in CI (CI=true), where a
missing Jupyter Book is a failure. The browser test uses Debian's Chromium like tests/test_browser.py.
"""

from __future__ import annotations

import base64
import functools
import html.parser
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from chromium import chromium_page

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
from nbtools import course_notebooks  # noqa: E402

SCREENSHOT_PAGE = "learn/04_it_costs_nothing.html"  # equations, a table and figures
EXPLORER_NOTEBOOK = "07_what_heads_do"


class _Page(html.parser.HTMLParser):
    """The links, images, scripts, stylesheets and element ids of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links, self.images, self.scripts, self.styles, self.ids = [], [], [], [], set()
        self.title, self._in_title = "", False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        elif tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])
        elif tag == "link" and attrs.get("href"):
            (self.styles if "stylesheet" in (attrs.get("rel") or "") else self.links).append(attrs["href"])
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag):
        self._in_title = False


@functools.cache
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _external(url: str) -> bool:
    return bool(urlsplit(url).scheme) or url.startswith("//")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("jupyter_book") is None:
        if os.environ.get("CI"):
            pytest.fail("CI=true but Jupyter Book is not installed: `python3 course.py test` installs the site extra")
        pytest.skip("needs the site extra: pip install -e .[site] (python3 course.py test installs it)")
    out = tmp_path_factory.mktemp("website") / "site"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_site.py"), str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"the website did not build:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    print(result.stdout.strip().splitlines()[-1])  # "website built in N s: ..."
    return out


def _notebook_images(nb) -> list[bytes]:
    """The PNG outputs a static page shows: one per output that has image/png."""
    return [
        base64.b64decode(output.data["image/png"])
        for cell in nb.cells if cell.cell_type == "code"
        for output in cell.get("outputs", []) if "image/png" in output.get("data", {})
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_every_notebook_has_its_page_and_figures(site, path):
    page_path = site / "learn" / f"{path.stem}.html"
    assert page_path.exists(), f"no page for {path.name}"
    nb = nbformat.read(path.parent.parent / "learn" / path.name, as_version=4)  # the pages show the learner copies
    heading = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("# "))
    title = re.sub(r"\[!\[Open In Colab\].*$", "", heading.splitlines()[0][2:]).strip()  # (the badge stays off)
    page = _parse(page_path)
    assert title.split(":")[0].split("`")[0].strip() in page.title, (page.title, title)
    shown = {(page_path.parent / unquote(src)).resolve().read_bytes() for src in page.images if "_images/" in src}
    missing = [i for i, png in enumerate(_notebook_images(nb)) if png not in shown]
    assert not missing, f"{path.name}: figures {missing} (of {len(_notebook_images(nb))}) are not on its page"
    text = page_path.read_text(encoding="utf-8")
    assert "@title checks:" not in text and "BEGIN SOLUTION" not in text  # check cells' code is left off


@pytest.mark.slow
def test_the_instructors_guide_has_the_course_map_the_mistakes_and_the_ways_to_run_a_class(site):
    from labs_corpus import CORPUS

    import mhalab.labs as labs

    page = site / "instructors.html"
    assert page.exists(), "no instructors' page"
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))
    text = " ".join(text.split()).translate(str.maketrans("‘’“”", "''\"\""))  # (Sphinx's smart quotes)
    for path in course_notebooks():
        assert path.stem[:2] in text
    for nb in labs.available_notebooks():
        for ex in labs.load(nb):
            assert f"{ex.key} {ex.title} {ex.points:g}" in text, ex.key  # the exercise's row: key, title, points
            answer, expected = CORPUS[ex.key]["wrong"][0]
            # a wrong answer's message, as the learner gets it
            assert " ".join(ex.verdict(answer)[1].split()) in text, ex.key
    for words in ("repo2docker", "postBuild", "nbgrader generate_assignment", "MHALAB_LABS_STRICT=1 nbgrader autograde",
                  "results.json", "gradebook.csv", "run time"):
        assert words in text, words


@pytest.mark.slow
def test_the_start_page_shows_its_shape_sheet_and_glossary_as_tables(site):
    """Notebook 00's shape sheet is Markdown a cell displays; CommonMark would show its table as text."""
    text = (site / "learn" / "00_setup.html").read_text(encoding="utf-8")
    tables = re.findall(r"<table.*?</table>", text, flags=re.S)
    assert any("shape here" in t and "hook_pattern" in t for t in tables), "the shape sheet is not a table"
    assert any("taught in" in t for t in tables), "the glossary is not a table"


@pytest.mark.slow
def test_the_explorer_shows_its_still_picture(site):
    """The head explorer's output is a widget in Jupyter; on the website, its still PNG (with the line on
    how to get the sliders) must show instead, with no widget JavaScript from a CDN."""
    path = next(p for p in course_notebooks() if p.stem == EXPLORER_NOTEBOOK)
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
               and "HeadExplorer" in o.data.get("text/plain", "")]
    assert outputs, f"{path.name} has no committed head-explorer output"
    assert all("image/png" in o.data for o in outputs), (
        f"{path.name}'s explorer output has no still picture: "
        f"re-run it with `python3 course.py execute notebooks/{path.name}`"
    )
    page_path = site / "learn" / f"{path.stem}.html"
    shown = {(page_path.parent / unquote(src)).resolve().read_bytes()
             for src in _parse(page_path).images if "_images/" in src}
    for output in outputs:
        assert base64.b64decode(output.data["image/png"]) in shown
    text = page_path.read_text(encoding="utf-8")
    assert "widget-view+json" not in text and "html-manager" not in text


@pytest.mark.slow
def test_no_broken_internal_link_and_nothing_from_the_network(site):
    pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)  # _static: theme templates
    assert len(pages) >= len(course_notebooks()) + 2  # + intro, search
    broken, remote = [], []
    for page_path in pages:
        page = _parse(page_path)
        for url in page.scripts + page.styles:
            if _external(url):
                remote.append(f"{page_path.relative_to(site)}: {url}")
        for url in page.links + page.images + page.scripts + page.styles:
            if _external(url) or url.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(url)
            target = page_path if not parts.path else (page_path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page_path.relative_to(site)}: {url}")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parse(target).ids:
                broken.append(f"{page_path.relative_to(site)}: {url} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:30])
    assert not remote, "scripts or styles loaded from the network:\n" + "\n".join(remote[:30])
    mathjax = [s for s in _parse(site / SCREENSHOT_PAGE).scripts if "mathjax" in s.lower()]
    assert mathjax and (site / "learn" / unquote(urlsplit(mathjax[0]).path)).resolve().is_file()


@pytest.mark.slow
@pytest.mark.browser
def test_a_page_in_a_browser(site, tmp_path):
    """Serve the site on localhost, open one page in headless Chromium: equations typeset by the local
    MathJax, every image loaded, no page error; search finds a word; a screenshot is kept (set
    MHALAB_SCREENSHOT_DIR to keep it outside the temporary folder)."""
    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    errors, requests = [], []
    shot = tmp_path / "site-page.png"
    try:
        with sync_playwright() as p:
            with chromium_page(p, width=1280, height=900) as page:
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.on("request", lambda request: requests.append(request.url))
                page.goto(f"{base}/{SCREENSHOT_PAGE}", wait_until="load", timeout=60_000)
                page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 10", timeout=60_000)
                assert page.locator("mjx-merror").count() == 0, "MathJax could not typeset an equation"
                assert page.evaluate("() => Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
                page.locator("img[src*='_images/']").first.scroll_into_view_if_needed()
                page.screenshot(path=str(shot))
                page.goto(f"{base}/search.html?q=cache", wait_until="load", timeout=60_000)
                page.wait_for_selector("#search-results li", timeout=60_000)
                assert page.locator("#search-results li a[href*='04_it_costs_nothing']").count() >= 1
    finally:
        server.shutdown()
    assert not errors, errors
    outside = [url for url in requests if not url.startswith((base, "data:", "blob:"))]
    assert not outside, f"the page asked for something outside the site: {outside[:10]}"
    assert shot.stat().st_size > 10_000
    if os.environ.get("MHALAB_SCREENSHOT_DIR"):
        Path(os.environ["MHALAB_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["MHALAB_SCREENSHOT_DIR"]) / shot.name)


@pytest.mark.slow
def test_the_learners_and_contributors_guides_are_pages(site):
    """What the README leaves out lives in the guides, which the website shows as pages of their own."""
    expected = {"learners": ("MultiHeadAttention", "MHALAB_TORCH", "ipywidgets", "True means"),
                "contributors": ("course.py execute", "set-repo", "Adding an exercise", "gh-pages")}
    for name, words in expected.items():
        page = site / f"{name}.html"
        assert page.exists(), f"no {name} page"
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))).split())
        for word in words:
            assert word in text, (name, word)
