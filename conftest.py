"""pytest plugin for the whole repository (tests/ and notebooks/): keep what the notebooks printed and drew.

With ``MHALAB_NOTEBOOK_OUTPUTS=DIR`` set (``.ci/run`` sets it), every notebook that nbval runs is also
written to ``DIR/<name>.ipynb`` holding the outputs of *this* run, cell by cell as they finish, so a CI
run that fails can upload what a failing notebook showed (the GitHub workflow does, as an artifact).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

_RUNS: dict[str, object] = {}  # notebook path -> the copy being filled with this run's outputs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    target = os.environ.get("MHALAB_NOTEBOOK_OUTPUTS")
    outputs = getattr(item, "test_outputs", None)  # set by nbval's IPyNbCell while it runs a cell
    if not target or call.when != "call" or outputs is None or not hasattr(item, "cell"):
        return
    import nbformat

    source_nb = item.parent.nb
    path = str(item.parent.path)
    run = _RUNS.get(path)
    if run is None:
        run = copy.deepcopy(source_nb)
        for cell in run.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        _RUNS[path] = run
    index = next(i for i, cell in enumerate(source_nb.cells) if cell is item.cell)
    run.cells[index].outputs = [nbformat.from_dict(output) for output in outputs]
    out_dir = Path(target)
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(run, out_dir / Path(path).name)
