"""Every notebook's asserts sit in folded check cells (tools/check_cells.py), and none was dropped or changed
without tests/notebook_asserts.txt saying so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import check_cells  # noqa: E402

NOTEBOOKS = check_cells.course_notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_assert_is_in_a_folded_check_cell_with_a_title(path):
    nb = json.loads(path.read_text())
    assert check_cells.problems(nb, path.name) == []
    assert any(check_cells.is_check_cell(c) for c in nb["cells"]) == bool(check_cells.all_asserts([path]))


def test_the_asserts_are_those_recorded():
    gone, new = check_cells.assert_changes()
    assert (gone, new) == ([], []), "run `python tools/check_cells.py --record` and say why in the commit"


def test_the_rules_catch_what_they_should():
    lesson = {"cell_type": "code", "metadata": {}, "source": "x = 1\nassert x == 1\n"}
    assert "outside a check cell" in check_cells.problems({"cells": [lesson]}, "nb")[0]
    unfolded = {"cell_type": "code", "metadata": {"tags": ["checks"]}, "source": "# @title checks: x is one\nassert x"}
    assert "is folded" in check_cells.problems({"cells": [unfolded]}, "nb")[0]
    check_cells.fold(unfolded)
    assert check_cells.problems({"cells": [unfolded]}, "nb") == []
    untitled = {"cell_type": "code", "metadata": unfolded["metadata"], "source": "assert x"}
    assert "says what it checks" in check_cells.problems({"cells": [untitled]}, "nb")[0]
    magic = "%pip install x\nif True:\n    %time y = 2\nassert y == 2"
    assert check_cells.assert_statements(magic) == ["assert y == 2"]


def test_two_pythons_writing_one_assert_differently_agree():
    # Python 3.10's ast.unparse keeps a lone generator argument's parentheses; 3.11 drops them.
    older, newer = "01: assert all((x > 0 for x in xs))", "01: assert all(x > 0 for x in xs)"
    assert check_cells._unmatched([older], [newer]) == []
    assert check_cells._unmatched([older, older], [newer]) == [older]
    assert check_cells._unmatched(["01: assert all(x >= 0 for x in xs)"], [newer]) != []
