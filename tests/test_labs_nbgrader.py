"""Tests for the nbgrader cell metadata of the answer cells (``python -m mhalab.labs nbgrader --mark``).

nbgrader's ``generate_assignment`` refuses a ``### BEGIN SOLUTION`` region outside a cell marked as
a solution, so every committed course notebook must carry that metadata on its answer cells; a
notebook rebuilt or edited without it fails here. The marking itself is tested on the synthetic
notebook of tests/labs_fixture.py.
"""

from __future__ import annotations

import copy
import json
import re

import nbformat
import pytest

from labs_fixture import lab_notebooks, synthetic_notebook  # also registers notebook "99"'s exercises
from mhalab.labs.__main__ import main as labs_main
from mhalab.labs.release import (
    ANSWER_METADATA,
    MarkerError,
    mark_answer_cells,
    nbgrader_version,
    plan,
    solution_regions,
    student_version,
)

LAB_NOTEBOOKS = lab_notebooks()
nb_ids = [p.stem for p in LAB_NOTEBOOKS]
GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]+$")  # nbgrader's schema v3 pattern (and not empty)
SCHEMA_V3_KEYS = {"schema_version", "grade", "locked", "solution", "task", "grade_id", "points", "checksum", "cell_type"}


def has_region(cell) -> bool:
    return bool(solution_regions(cell.source, code=cell.cell_type == "code")) if cell.cell_type in ("code", "markdown") else False


def without_metadata(nb) -> list[dict]:
    return [{k: v for k, v in cell.items() if k != "metadata"} for cell in nb.cells]


def executed_synthetic():
    nb = synthetic_notebook()
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="✓ Exercise 99.1 (double a number): correct.\n")]
    nb.cells[4].execution_count = 3
    nb.cells[5].metadata["tags"] = ["keep-output"]
    return nb


# --------------------------------------------------------------------------- the committed notebooks


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=nb_ids)
def test_course_notebook_answer_cells_carry_nbgrader_metadata(path):
    """Every cell with a solution region is an nbgrader answer cell (schema v3, unique grade_id), no
    cell without a region claims to be one (nbgrader would blank it), and marking again changes nothing."""
    nb = nbformat.read(path, as_version=4)
    fix = f"run `python -m mhalab.labs nbgrader --mark {path.parent.name}/` and commit the result"
    ids = []
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        if has_region(cell):
            assert meta, f"{path.name} cell {index} holds a solution region but no nbgrader metadata: {fix}"
            assert meta["schema_version"] == 3 and meta["solution"] is True and meta["locked"] is False, (index, meta)
            assert set(meta) <= SCHEMA_V3_KEYS, (index, meta)
            if cell.cell_type == "markdown" or meta["grade"]:
                assert meta["grade"] is True and meta["points"] >= 0, (index, meta)
            else:
                assert meta["grade"] is False, (index, meta)
            assert GRADE_ID.match(meta["grade_id"]), (index, meta)
            ids.append(meta["grade_id"])
        elif meta and meta.get("solution"):
            pytest.fail(f"{path.name} cell {index} is an nbgrader solution cell without a solution region: {fix}")
    assert ids and len(ids) == len(set(ids)), f"{path.name}: grade_ids must be unique, got {ids}"
    assert all(re.fullmatch(rf"ex{path.name[:2]}-\d+-(answer|written)(-\d+)?", i) for i in ids), ids
    assert mark_answer_cells(copy.deepcopy(nb), path) == [], fix


# --------------------------------------------------------------------------- marking, on the synthetic notebook


def test_mark_answer_cells_adds_only_metadata_and_is_idempotent():
    nb = executed_synthetic()
    before = copy.deepcopy(nb)
    changes = mark_answer_cells(nb)
    assert len(changes) == 4
    metas = {i: c.metadata.get("nbgrader") for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata}
    assert metas == {
        4: {**ANSWER_METADATA, "grade_id": "ex99-1-answer"},
        5: {**ANSWER_METADATA, "grade_id": "ex99-2-answer"},
        6: {**ANSWER_METADATA, "grade": True, "points": 0, "grade_id": "ex99-3-written"},  # markdown: nbgrader wants it graded
        7: {**ANSWER_METADATA, "grade_id": "ex99-3-answer"},
    }
    assert ANSWER_METADATA == {"grade": False, "locked": False, "schema_version": 3, "solution": True}
    assert without_metadata(nb) == without_metadata(before)  # sources, outputs, execution counts, ids
    assert nb.cells[5].metadata["tags"] == ["keep-output"] and nb.metadata == before.metadata
    nbformat.validate(nb)

    marked = copy.deepcopy(nb)
    assert mark_answer_cells(nb) == [] and nb == marked  # a second run changes nothing
    assert mark_answer_cells(executed_synthetic()) == changes  # and the ids do not depend on the run


def test_mark_keeps_ids_fixes_copies_and_drops_stale_marks():
    nb = synthetic_notebook()
    mark_answer_cells(nb)
    nb.cells[4].metadata["nbgrader"].update(grade_id="double-it", grade=True, points=2)  # an instructor's choice: kept
    nb.cells.insert(6, copy.deepcopy(nb.cells[5]))  # a copied answer cell copies its metadata (and grade_id) too
    nb.cells[8].source = "mask = torch.ones(5, 5, dtype=torch.bool).tril()"  # the region is gone from this answer cell
    changes = mark_answer_cells(nb)
    assert changes == [
        "cell 8: no solution region any more, nbgrader metadata 'ex99-3-answer' removed",
        "cell 6: marked as an nbgrader answer cell, grade_id 'ex99-2-answer-2'",
    ]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert ids == [None, None, None, None, "double-it", "ex99-2-answer", "ex99-2-answer-2", "ex99-3-written", None, None]
    assert nb.cells[4].metadata["nbgrader"]["points"] == 2
    assert mark_answer_cells(nb) == []


def test_mark_refuses_malformed_markers():
    nb = synthetic_notebook()
    nb.cells[4].source = nb.cells[4].source.replace("    ### END SOLUTION\n", "")
    with pytest.raises(MarkerError, match="without an END"):
        mark_answer_cells(nb)


def test_mark_command_in_place_and_check(tmp_path, capsys):
    path = tmp_path / "99_fixture.ipynb"
    nbformat.write(executed_synthetic(), path)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")]), tmp_path / "98_plain.ipynb")
    original, plain = path.read_text(), (tmp_path / "98_plain.ipynb").read_text()

    assert labs_main(["nbgrader", "--mark", "--check", str(tmp_path)]) == 1  # lists, writes nothing
    assert "99_fixture.ipynb: would change" in capsys.readouterr().out and path.read_text() == original

    assert labs_main(["nbgrader", "--mark", str(tmp_path)]) == 0
    marked = path.read_text()
    a, b = json.loads(original), json.loads(marked)
    for cell in b["cells"]:
        cell["metadata"].pop("nbgrader", None)
    assert a == b and (tmp_path / "98_plain.ipynb").read_text() == plain
    assert marked.count('"grade_id"') == 4

    assert labs_main(["nbgrader", "--mark", "--check", str(tmp_path)]) == 0
    assert labs_main(["nbgrader", "--mark", str(tmp_path)]) == 0 and path.read_text() == marked  # byte for byte
    with pytest.raises(SystemExit, match="in place"):
        labs_main(["nbgrader", "--mark", str(tmp_path), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="output folder"):
        labs_main(["nbgrader", str(tmp_path)])


# --------------------------------------------------------------------------- the other commands, with the metadata present


def test_release_and_nbgrader_copies_work_on_marked_notebooks():
    nb = synthetic_notebook()
    mark_answer_cells(nb)
    assert plan(nb).problems == [] and plan(nb).warnings == []
    student, _ = student_version(nb)
    assert "BEGIN SOLUTION" not in "\n".join(c.source for c in student.cells)
    assert "raise NotImplementedError" in student.cells[4].source
    graded = nbgrader_version(nb)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in graded.cells if "nbgrader" in c.metadata]
    assert ids == ["ex99-1-answer", "ex99-1-check", "ex99-2-answer", "ex99-2-check", "ex99-3-written", "ex99-3-answer", "ex99-3-check"]


def test_nbgrader_accepts_the_marked_notebook():
    """With nbgrader installed (it is not a dependency): its metadata validator and ClearSolutions,
    with enforce_metadata left on, accept the marked notebook as it is."""
    preprocessors = pytest.importorskip("nbgrader.preprocessors")
    from nbgrader.nbgraderformat import MetadataValidator

    nb = synthetic_notebook()
    with pytest.raises(RuntimeError, match="non-solution cell"):
        preprocessors.ClearSolutions().preprocess(copy.deepcopy(nb), {"language": "python"})
    mark_answer_cells(nb)
    MetadataValidator().validate_nb(nb)
    cleared, _ = preprocessors.ClearSolutions().preprocess(nb, {"language": "python"})
    text = "\n".join(c.source for c in cleared.cells)
    assert "return 2 * x" not in text and "raise NotImplementedError()" in text and "q1.check(double)" in text
