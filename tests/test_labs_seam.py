"""The seam between the exercises and the grader (issue 47, point 4): the modules of ``mhalab/labs`` import one
another without a circle, function-level imports included; the grader keeps no source text of mhalab in strings
and copies no mhalab file into the grading kernel beyond the package itself (less the exercise modules); the
learner's check holds no grading switch, only a runner; and one helper makes grade ids."""

from __future__ import annotations

import ast
import filecmp
import inspect
import os
import re
from pathlib import Path

import pytest
from mhalab_grader import kernel, kernel_labs, worker

import mhalab.labs as labs
from mhalab.labs import calls, core

ROOT = Path(__file__).resolve().parent.parent
LABS = ROOT / "mhalab" / "labs"
GRADER = ROOT / "grader" / "mhalab_grader"


MODULES = {f"mhalab.labs.{p.stem}" for p in LABS.glob("*.py") if p.stem != "__init__"}


def _imports(source: str, package: str = "mhalab.labs") -> set[str]:
    """The mhalab.labs modules ``source`` (a module of ``package``) imports anywhere in it: at module level and in
    functions and methods, absolute or relative, a module or a name from one."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .core import X, from . import core
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name if name in MODULES else name.rsplit(".", 1)[0] for name in names}
    return found & MODULES


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_modules_of_mhalab_labs_import_one_another_without_a_circle():
    graph = {f"mhalab.labs.{p.stem}": _imports(p.read_text()) for p in LABS.glob("*.py") if p.stem != "__init__"}
    assert graph["mhalab.labs.core"] >= {"mhalab.labs.calls", "mhalab.labs.verdicts"}  # (the reader reads them)
    circle = _cycle(graph)
    assert circle is None, f"a circle of imports in mhalab/labs: {' -> '.join(circle)}"
    assert not graph["mhalab.labs.verdicts"] and not graph["mhalab.labs.invoke"], "the leaves import nothing of it"


def test_an_import_inside_a_function_makes_a_circle_too():
    source = "from .verdicts import Wrong\n\ndef f():\n    from .core import Exercise\n    from . import judging\n"
    assert _imports(source) == {"mhalab.labs.verdicts", "mhalab.labs.core", "mhalab.labs.judging"}
    graph = {f"mhalab.labs.{p.stem}": _imports(p.read_text()) for p in LABS.glob("*.py") if p.stem != "__init__"}
    assert _cycle({**graph, "mhalab.labs.verdicts": _imports(source)}) is not None


def test_the_learners_check_has_a_runner_and_no_grading_switch():
    assert "runner" in calls.Check.__dataclass_fields__ and "remote" not in calls.Check.__dataclass_fields__
    assert calls.Check().runner is calls.LOCAL
    text = "\n".join(p.read_text() for p in LABS.glob("*.py"))
    assert not re.search(r"\bremote\b", text), "mhalab.labs still speaks of a remote (grading) switch"
    # the grading kernel is a runner as the local one is
    for method in ("run", "received"):
        assert callable(getattr(kernel.GradingKernel, method)) and callable(getattr(calls.LocalRunner, method))


def test_the_grader_keeps_no_source_text_of_mhalab_in_strings():
    """No string constant in the grader holds Python source (a module or class body): the grading kernel's
    mhalab.labs is a file of the grader, linted as the rest (tests/test_lint.py)."""
    for path in sorted(GRADER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") > 5:
                code = re.findall(r"^\s*(?:def |class |import |from \S+ import )", node.value, re.M)
                assert len(code) < 2, f"{path.name}: a string holds source code ({node.value[:80]!r}...)"


def test_the_grading_kernels_code_is_the_package_less_its_exercises_and_the_graders_own_files():
    root = Path(kernel.sandbox())
    package = ROOT / "mhalab"
    found = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    beside = {name for name in found if not name.startswith("pkg/")}
    assert beside == {"_mhalab_grading.py", "_mhalab_fork.py"}, beside
    assert filecmp.cmp(root / "_mhalab_grading.py", worker.__file__, shallow=False)
    kept = {name for name in found if name.startswith("pkg/mhalab/labs/")}
    assert kept == {f"pkg/mhalab/labs/{n}" for n in ("__init__.py", *kernel.KERNEL_LABS)}, kept
    assert filecmp.cmp(root / "pkg/mhalab/labs/__init__.py", kernel_labs.__file__, shallow=False)
    for name in found - beside - {"pkg/mhalab/labs/__init__.py"}:  # every other file: the package's, unchanged
        original = package / name[len("pkg/mhalab/"):]
        assert original.is_file() and filecmp.cmp(root / name, original, shallow=False), name
    exercises = {p.name for p in (package / "labs").glob("*.py")} - set(kernel.KERNEL_LABS) - {"__init__.py"}
    assert {"core.py", "calls.py", "judging.py", "ex01.py"} <= exercises  # what stays out
    assert not any(f"pkg/mhalab/labs/{n}" in found for n in exercises)


def test_the_kernels_labs_module_hands_answers_in_and_gives_them_back(monkeypatch):
    monkeypatch.setattr(kernel_labs, "_EXERCISES", {"04": (kernel_labs.Exercise("04", 1, "a title", "*label*"),)})
    q = kernel_labs.load(4)[0]
    assert q.label == "*label*" and q.reference is None and q.solution_text == ""
    answer = object()
    assert q.use(answer) is answer  # the learner's answer as it is, checked or not
    assert kernel_labs.Wrong is labs.Wrong


def test_one_helper_makes_grade_ids():
    assert core.grade_id("04.1") == "ex04-1-answer" and core.grade_id("4.12", "test") == "ex04-12-test"
    assert core.parse_grade_id("ex04-1-answer") == ("04.1", "answer")
    assert core.parse_grade_id("ex12-2-written") == ("12.2", "written") and core.parse_grade_id("ex3-1-answer") is None
    assert labs.exercise("04", 2).grade_id == "ex04-2-answer"
    pattern = re.compile(r"""f["']ex\{[^}]*\}-""")  # an f-string that builds one by hand
    for folder in (ROOT / "mhalab", GRADER, ROOT / "tools", ROOT / "tests", ROOT / "benchmarks"):
        for path in folder.rglob("*.py"):
            allowed = 1 if path == LABS / "core.py" else 0  # the helper itself
            assert len(pattern.findall(path.read_text())) == allowed, f"{path}: make grade ids with core.grade_id"


@pytest.mark.parametrize("ex", [ex for nb in labs.available_notebooks() for ex in labs.load(nb)], ids=lambda e: e.key)
def test_each_answer_is_written_once_its_reference_is_what_its_solution_defines(ex):
    assert ex.template and ex.reference.__name__ == ex.template[0]
    assert inspect.getsource(ex.reference).strip() == ex.solution_text.strip()  # the text is the code that runs
    assert os.path.dirname(ex.reference.__code__.co_filename) == str(LABS)  # seen as the course's own code
