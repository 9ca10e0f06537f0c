"""The widgets with the ipywidgets Colab ships (7.7.1) in the kernel.

pip puts ipywidgets 7.7.1 (and ipython_genutils, which it imports) into a folder of their own
(``--no-deps --target``: two small pure-Python wheels, seconds), and that folder goes first on the
PYTHONPATH of a child process: a pytest run of tests/test_widgets.py, and a kernel.

The browser half needs a frontend that draws ipywidgets 7 widgets. JupyterLab 4's widget manager
(jupyterlab_widgets 3) draws only ipywidgets 8 ones: with a 7.7.1 kernel it shows "Click to show
javascript error" (Module @jupyter-widgets/controls, version ^1.5.0 is not registered), so
tests/test_browser.py cannot pass there, and the `lab` extra asks for ipywidgets>=8. Colab draws
ipywidgets 7 with a manager of its own; the nearest stand-in that pip installs is JupyterLab 3.6 with
jupyterlab_widgets 1.1 (the same @jupyter-widgets/controls 1.5 models and jQuery UI sliders), in a
throwaway environment that only serves pages: its kernel is this Python with the 7.7.1 overlay. A
small explorer (an untrained model: nothing to train) is moved with the keyboard there, as
tests/test_browser.py does with notebook 07, and its heat map must change with every move.

Slow: the JupyterLab 3 environment takes a minute or so to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import nbformat
import pytest
from chromium import chromium_page, jupyterlab_server, run_cell

ROOT = Path(__file__).resolve().parent.parent
IPYWIDGETS_7 = ("ipywidgets==7.7.1", "ipython_genutils==0.2.0")
JUPYTERLAB_3 = ("jupyterlab>=3.6,<4", "jupyterlab_widgets>=1.1,<2")
pytestmark = pytest.mark.slow

EXPLORER_CELL = """\
import ipywidgets, torch
from mhalab import widgets
from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask
task = MultiRelationTask((-1, 2), vocab_size=8, seq_len=8)
torch.manual_seed(0)
model = Transformer(ModelConfig.for_task(task, d_model=16, n_heads=4, n_layers=2))
batch = task.sample(16, generator=torch.Generator().manual_seed(3))
print("ipywidgets", ipywidgets.__version__)
widgets.head_explorer(model, batch, task, examples=3)"""


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ipywidgets7")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *IPYWIDGETS_7],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, f"pip could not install {IPYWIDGETS_7}:\n{result.stderr[-3000:]}"
    return folder


def _pythonpath(overlay: Path) -> str:
    return os.pathsep.join([str(overlay), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def test_widget_tests_pass_with_ipywidgets_7(overlay, tmp_path):
    env = dict(os.environ, PYTHONPATH=_pythonpath(overlay))
    probe = subprocess.run([sys.executable, "-c", "import ipywidgets; print(ipywidgets.__version__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.strip() == "7.7.1", probe.stderr[-2000:]
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_widgets.py", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'child'}"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )
    assert child.returncode == 0, f"tests/test_widgets.py with ipywidgets 7.7.1:\n{child.stdout[-5000:]}"
    assert " passed" in child.stdout and "skipped" not in child.stdout


@pytest.mark.browser
def test_the_explorer_in_a_browser_with_ipywidgets_7(overlay, tmp_path):
    from playwright.sync_api import sync_playwright

    # The frontend: JupyterLab 3.6 + jupyterlab_widgets 1.1, alone in a throwaway environment.
    lab_env = tmp_path / "jupyterlab3"
    venv.EnvBuilder(with_pip=True).create(lab_env)
    lab_python = lab_env / "bin" / "python"
    install = subprocess.run([str(lab_python), "-m", "pip", "install", "-q", *JUPYTERLAB_3],
                             capture_output=True, text=True)
    assert install.returncode == 0, f"pip install {JUPYTERLAB_3} failed:\n{install.stderr[-3000:]}"

    # Its only kernel: this Python, with ipywidgets 7.7.1 first on the path.
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (Colab-like widgets)", "language": "python",
        "env": {"PYTHONPATH": _pythonpath(overlay), "OMP_NUM_THREADS": "1"},
    }))
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(EXPLORER_CELL)]
    nbformat.write(nb, root / "explorer.ipynb")

    # The server runs JupyterLab 3 alone (no PYTHONPATH); its kernels come from tmp_path/jupyter only.
    env = {"JUPYTER_PATH": str(tmp_path / "jupyter"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "PYTHONPATH": None}
    args = ("--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    errors: list[str] = []
    with jupyterlab_server(root, tmp_path, python=lab_python, env=env, args=args) as (base, token, log):
        with sync_playwright() as p:
            with chromium_page(p, width=1400, height=1000) as page:
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(f"{base}/lab/tree/explorer.ipynb?token={token}", timeout=120_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                page.wait_for_function(  # the kernel is up: its status in the toolbar reads idle
                    "() => Array.from(document.querySelectorAll("
                    "'.jp-Toolbar-kernelStatus, .jp-KernelStatus, .jp-Notebook-ExecutionIndicator'))"
                    ".some(e => /idle/i.test(e.getAttribute('title') || e.dataset.status || e.textContent))",
                    timeout=180_000, polling=500,
                )
                try:
                    run_cell(page, 0, dialogs=[])
                except AssertionError:
                    page.screenshot(path=str(tmp_path / "not-started.png"))
                    raise
                image = page.locator(".mhalab-head-explorer img")
                try:
                    image.wait_for(timeout=180_000)
                except Exception as error:
                    page.screenshot(path=str(tmp_path / "no-image.png"))
                    prompt = page.locator(".jp-CodeCell .jp-InputArea-prompt").first.inner_text()
                    output = page.locator(".jp-Notebook .jp-OutputArea").first.inner_text()[-2000:]
                    raise AssertionError(f"no explorer image; the cell's prompt {prompt!r}, its output:\n{output}\n"
                                         f"JupyterLab's log:\n{log.read_text()[-2000:]}") from error
                printed = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']").first
                assert printed.inner_text().strip() == "ipywidgets 7.7.1"  # the kernel really ran 7.7.1
                handles = page.locator(".mhalab-head-explorer .ui-slider-handle")  # ipywidgets 7: jQuery UI
                assert handles.count() == 3  # layer, head, example
                seen = [image.get_attribute("src")]
                for index, key in ((1, "ArrowRight"), (1, "ArrowRight"), (0, "ArrowRight"), (1, "ArrowLeft")):
                    handles.nth(index).focus()
                    page.keyboard.press(key)
                    page.wait_for_function("([src]) => document.querySelector('.mhalab-head-explorer img').src !== src",
                                           arg=[seen[-1]], timeout=30_000)
                    seen.append(image.get_attribute("src"))
                assert len(set(seen)) == len(seen), "a slider move left the heat map unchanged"
                assert page.get_by_text("Error displaying widget").count() == 0
                stderr_output = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                assert page.locator(stderr_output).count() == 0
                page.screenshot(path=str(tmp_path / "ipywidgets7.png"))
    assert not errors, errors
