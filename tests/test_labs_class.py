"""A whole class through ``python -m mhalab_grader grade submitted/ -j 2``: correct, partly wrong, crashing,
endless, forged, relabelled and unreadable submissions (tests/labs_fixture.py), every row of the gradebook
checked, a feedback page and a Gradescope results.json per learner. Starts some 30 grading kernels (slow)."""

from __future__ import annotations

import csv
import json

import nbformat
import pytest
from labs_fixture import CLASS_KINDS, build_class, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab_grader.__main__ import main as labs_main

pytestmark = pytest.mark.slow


def test_a_class_is_graded_row_by_row(tmp_path, capsys):
    expected = build_class(tmp_path / "course")
    assert len(expected) >= 30
    assert set(CLASS_KINDS) >= {"correct", "crashing", "endless", "forged", "relabelled"}
    source = tmp_path / "source"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    out = tmp_path / "graded"
    assert labs_main(["grade", str(tmp_path / "course"), "--source", str(source), "-j", "2", "--timeout", "12",
                      "--out", str(out), "--gradescope"]) == 0
    with open(out / "gradebook.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["student"] for r in rows] == sorted(expected)
    assert list(rows[0]) == ["student", "99.1", "99.2", "99.3", "total", "max_total", "flags"]
    for row in rows:
        assert float(row["total"]) == expected[row["student"]], row
        assert float(row["max_total"]) == 3
        assert float(row["total"]) == sum(float(row[k]) for k in ("99.1", "99.2", "99.3"))
        assert ("labelled for notebook 01" in row["flags"]) == row["student"].startswith("relabelled"), row
        page = (out / "feedback" / row["student"] / "99.html").read_text()
        assert f"{float(row['total']):g} of 3 points" in page
        assert "FLAG" not in page and "labelled for notebook" not in page
        results = json.loads((out / "gradescope" / row["student"] / "99.json").read_text())
        assert results["score"] == expected[row["student"]]
        assert [t["max_score"] for t in results["tests"]] == [1, 1, 1]
        assert all({"name", "score", "max_score", "output", "visibility"} <= set(t) for t in results["tests"])
    assert "No answer cell for 99.1, 99.2, 99.3" in (out / "feedback" / "relabelled_0" / "99.html").read_text()
    assert f"graded {len(expected)} submission(s)" in capsys.readouterr().out


def test_each_learner_is_reported_as_graded(tmp_path, capsys):
    """A line per learner as each is graded (above tqdm's bar on a terminal), then the summary."""
    expected = build_class(tmp_path / "course", {k: (*CLASS_KINDS[k][:2], 1) for k in ("correct", "not_a_notebook")})
    source = tmp_path / "source"
    source.mkdir()
    nbformat.write(synthetic_notebook(), source / "99_fixture.ipynb")
    assert labs_main(["grade", str(tmp_path / "course"), "--source", str(source), "--timeout", "12",
                      "--out", str(tmp_path / "graded")]) == 0
    out = capsys.readouterr().out
    for student, total in expected.items():
        assert f"{student} 99: {total:g}/" in out, out
    assert "graded 2 submission(s)" in out
