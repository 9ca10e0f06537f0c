"""The fork path of grading a class (grader/mhalab_grader/zygote.py, forking.py): each submission's kernel is a
fork of one that ran the instructor's cells before the first answer cell. The same gradebook, byte for byte, as
a fresh kernel per submission (``--no-fork``), on the class fixture and on a course notebook; and what one
forked kernel leaves or does is not seen by another (files, /tmp, processes, loopback, the prepared kernel's
own files). The break-out attacks are run on both paths in tests/test_grader_sandbox.py."""

from __future__ import annotations

import copy
import filecmp
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from labs_fixture import CLASS_KINDS, build_class, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab_grader import sandbox
from mhalab_grader.__main__ import main as grader_main
from mhalab_grader.cells import answers, student_version
from mhalab_grader.grade import prefix_cells, prepare

_REQUIRED = os.environ.get("MHALAB_REQUIRE_SANDBOX") == "1"
pytestmark = pytest.mark.skipif(sandbox.problem() is not None and not _REQUIRED, reason=str(sandbox.problem()))
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """A forked kernel computes on one thread (libgomp's pool does not survive a fork); the fresh kernels it is
    compared with take the grader's OMP_NUM_THREADS: set it to 1 so both sum in the same order, to the bit."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")


def grade_both_ways(course: Path, source: Path, out: Path, *extra: str) -> None:
    for path in ("fork", "no-fork"):
        flags = ["--no-fork"] if path == "no-fork" else []
        assert grader_main(["grade", str(course), "--source", str(source), "-j", "2", "--out", str(out / path),
                            "--json", str(out / f"{path}.json"), *flags, *extra]) == 0


def assert_same(out: Path) -> None:
    """The same gradebook and feedback pages, byte for byte, and the same reports but for their time."""
    assert (out / "fork" / "gradebook.csv").read_bytes() == (out / "no-fork" / "gradebook.csv").read_bytes()
    pages = filecmp.dircmp(out / "fork" / "feedback", out / "no-fork" / "feedback")
    assert not pages.left_only and not pages.right_only
    for sub in pages.subdirs.values():
        assert not sub.diff_files and not sub.left_only and not sub.right_only
    reports = [json.loads((out / f"{p}.json").read_text()) for p in ("fork", "no-fork")]
    for report in reports[0] + reports[1]:
        report.pop("elapsed_s")
    assert reports[0] == reports[1]


@pytest.mark.slow
def test_the_class_fixture_gets_the_same_gradebook_by_both_paths(tmp_path):
    expected = build_class(tmp_path / "course")
    source = tmp_path / "source"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    grade_both_ways(tmp_path / "course", source, tmp_path, "--timeout", "12")
    assert_same(tmp_path)
    rows = (tmp_path / "fork" / "gradebook.csv").read_text().splitlines()[1:]
    assert {r.split(",")[0]: float(r.split(",")[4]) for r in rows} == expected
    assert len(expected) == sum(count for *_, count in CLASS_KINDS.values())


@pytest.mark.slow
def test_a_course_notebook_gets_the_same_gradebook_by_both_paths(tmp_path):
    """Notebook 04: its solution, its student version, and half its answers solved."""
    path = next((ROOT / "notebooks").glob("04_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    found = [a for a in answers(nb) if not a.written]
    assert prefix_cells(nb), "04 has instructor cells before its first answer cell"
    half = student_version(nb)
    for a in found[::2]:
        half.cells[a.index] = copy.deepcopy(nb.cells[a.index])
    for student, submission in {"solution": nb, "unanswered": student_version(nb), "half": half}.items():
        target = tmp_path / "course" / "submitted" / student / "04" / path.name
        target.parent.mkdir(parents=True)
        nbformat.write(submission, target)
    grade_both_ways(tmp_path / "course", path, tmp_path)
    assert_same(tmp_path)
    reports = json.loads((tmp_path / "fork.json").read_text())
    totals = {r["notebook"].split("/")[-3]: r["score"] for r in reports}
    assert totals["solution"] == sum(e["points"] for e in reports[0]["exercises"])
    assert totals["unanswered"] == 0 < totals["half"] < totals["solution"]


@pytest.fixture
def prepared(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    kernel = prepare("99", source=source, timeout=30, jobs=2)
    assert kernel.usable and kernel.errors == []
    yield kernel
    kernel.close()


def _answer(kernel, source: str):
    """What ``source`` (setting ``x``) leaves in ``x``, through the grader's channel."""
    assert kernel.run_cell(source + "\nimport _mhalab_grading\n_mhalab_grading.ANSWERS['99.1'] = x") is None
    return kernel.value("99.1")


def _own_tmp() -> list[str]:
    """What a fresh fork's /tmp holds: IPython's folder, /dev/shm's, and where the sandbox binds the Python it runs
    (its prefixes and the folder of its executable, as given and as resolved) when that lives under /tmp (a venv in
    a clone in /tmp, or the floor run's venv in a folder of /tmp of its own): bound again in each fork, read-only,
    never copied. Nothing else of the machine is bound, this repository included (the grading code is a copy)."""
    folders = (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable))
    paths = {Path(os.path.abspath(p)) for p in folders} | {Path(p).resolve() for p in folders}
    under_tmp = {p.parts[2] for p in paths if p.parts[:2] == ("/", "tmp") and len(p.parts) > 2}
    return sorted({".ipython", ".shm"} | under_tmp)


def test_forked_kernels_do_not_see_each_other(prepared):
    a, b = prepared.fork(30), prepared.fork(30)
    try:
        assert _answer(a, "open('/tmp/mine', 'w').write('a')\nimport socket\nserver = socket.socket()\n"
                          "server.bind(('127.0.0.1', 5555))\nserver.listen()\nx = 1") == 1
        seen = _answer(b, "import os, socket\ntry:\n    socket.create_connection(('127.0.0.1', 5555), timeout=2)\n"
                          "    reached = True\nexcept OSError:\n    reached = False\n"
                          "x = (sorted(os.listdir('/tmp')), sorted(p for p in os.listdir('/proc') if p.isdigit()),"
                          " reached, open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
        assert seen[0] == _own_tmp() and seen[1:] == (["1", "2"], False, "0" * 16)
        # a file the prepared kernel had open in its /tmp (IPython's history) is, in each fork, its own copy
        # (one or two files, by IPython's version; files of a Python bound under /tmp are that Python's)
        bound = tuple(f"/tmp/{name}/" for name in _own_tmp() if name not in (".ipython", ".shm"))
        own = _answer(a, "import os\nx = [os.fstat(int(fd)).st_dev == os.stat('/tmp').st_dev\n"
                         "     for fd in os.listdir('/proc/self/fd') if os.path.realpath('/proc/self/fd/' + fd)"
                         f".startswith('/tmp/') and not os.path.realpath('/proc/self/fd/' + fd).startswith({bound!r})]")
        assert all(own), own
    finally:
        a.close()
        b.close()
    after = prepared.fork(30)
    try:
        assert _answer(after, "import os\nx = sorted(os.listdir('/tmp'))") == _own_tmp()
    finally:
        after.close()


def test_a_forked_kernel_leaves_nothing_running(prepared):
    marker = f"mhalab-forked-{os.getpid()}"
    kernel = prepared.fork(30)
    kernel.run_cell("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                    f"'import time; time.sleep(600)  # {marker}'], start_new_session=True)")
    kernel.close()
    left = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            left += [entry] if marker.encode() in Path("/proc", entry, "cmdline").read_bytes() else []
        except OSError:
            pass
    assert left == []

