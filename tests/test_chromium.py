"""The browser tests' own helpers (tests/chromium.py) against a real JupyterLab: ``dismiss_dialogs`` closes
each kind of dialog the right way, so a dialog on a loaded CI machine cannot stop a browser test."""

from __future__ import annotations

import nbformat
import pytest
from chromium import chromium_page, dismiss_dialogs, jupyterlab_server, run_cell

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _notebook(path, kernel: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("answer = 6 * 7"), nbformat.v4.new_code_cell("print(answer)")]
    nbformat.write(nb, path)


def _wait_for_dialog(page) -> None:
    page.locator(".jp-Dialog").first.wait_for(timeout=60_000)


def test_dismiss_dialogs_accepts_the_kernel_picker_and_cancels_a_question(tmp_path):
    from playwright.sync_api import sync_playwright

    root = tmp_path / "root"
    root.mkdir()
    _notebook(root / "picker.ipynb", "no-such-kernel")   # JupyterLab asks which kernel to start
    with jupyterlab_server(root, tmp_path) as (base, token, _), sync_playwright() as p:
        with chromium_page(p) as page:
            page.goto(f"{base}/lab/tree/picker.ipynb?token={token}", timeout=120_000)
            _wait_for_dialog(page)
            seen: list[str] = []
            dismiss_dialogs(page, seen)
            assert any(text.startswith("Select Kernel") for text in seen), seen   # (a busy machine may add others)
            assert page.locator(".jp-Dialog").count() == 0
            # The preselected kernel was started (not "No Kernel"): a cell runs.
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            run_cell(page, 0, seen)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)

            # A question (Kernel > Restart) is cancelled: the kernel keeps its variables.
            page.click("#jp-MainMenu .lm-MenuBar-itemLabel:text-is('Kernel')")
            page.click("li.lm-Menu-item[data-command='kernelmenu:restart']")
            _wait_for_dialog(page)
            before = len(seen)
            dismiss_dialogs(page, seen)
            assert any(text.startswith("Restart Kernel?") for text in seen[before:]), seen
            run_cell(page, 1, seen)
            page.locator(".jp-OutputArea-output").get_by_text("42").wait_for(timeout=60_000)
