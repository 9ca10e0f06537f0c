"""One way the tests start a JupyterLab server (on localhost, with settings of its own) and headless Chromium
(Debian's build, driven by Playwright, in a fresh profile)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

#: JavaScript for ``page.wait_for_function``: true once some code cell's prompt shows a number or "*" (the kernel
#: has the cell), in JupyterLab 3 and 4 alike.
CELL_STARTED = ("() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))"
                ".some(p => /\\S/.test(p.textContent.replace(/[\\[\\]: \\u00a0]/g, '')))")


def dismiss_dialogs(page, seen: list[str], budget_s: float = 120) -> None:
    """Close every JupyterLab dialog covering ``page``, appending the start of its text to ``seen``.

    A busy machine brings up dialogs no learner action caused: "Keep Waiting" while the server loads the
    workspace, "Server Connection Error" when a request times out. Each is closed with a button, never with
    Escape: a dialog only takes keys while it has the focus, which a headless page need not give it (a CI run
    failed waiting for a dialog that Escape had not closed). A kernel picker is accepted (the notebook's own
    kernel is preselected); any other dialog is cancelled (its reject button, else its only button). Raises
    AssertionError naming the dialogs if they still cover the page after ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    dialog = page.locator(".jp-Dialog").first
    while page.locator(".jp-Dialog").count():
        if time.monotonic() > deadline:
            raise AssertionError(f"JupyterLab dialogs still cover the page after {budget_s} s: {seen}")
        try:  # the dialog may close by itself between these calls: then try again
            seen.append(" ".join(dialog.inner_text(timeout=5_000).split())[:300])
            picker = dialog.locator(".jp-Dialog-body select").count() > 0
            buttons = ".jp-Dialog-footer button"
            chosen = dialog.locator(buttons + (".jp-mod-accept" if picker else ".jp-mod-reject"))
            (chosen if chosen.count() else dialog.locator(buttons)).first.click(timeout=5_000)
            dialog.wait_for(state="detached", timeout=10_000)
        except Exception:  # Playwright's TimeoutError, or the dialog went away mid-call
            time.sleep(1)


def start_until(page, trigger, started, dialogs: list[str], what: str, attempts: int = 3,
                timeout_s: float = 60) -> None:
    """Call ``trigger()`` (a key press, a menu click) until ``started()`` is true. On a loaded machine a key press
    or click can land before the notebook has the focus and is then lost (seen in a CI run), so each of
    ``attempts`` tries first closes any dialog (:func:`dismiss_dialogs`, which appends to ``dialogs``) and waits
    up to ``timeout_s``. Raises AssertionError naming ``what`` and the dialogs seen if it never starts."""
    for _ in range(attempts):
        dismiss_dialogs(page, dialogs)
        trigger()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if started():
                return
            time.sleep(0.5)
    raise AssertionError(f"{what} did not start in {attempts} tries of {timeout_s} s; dialogs: {dialogs}")


def run_cell(page, index: int, dialogs: list[str]) -> None:
    """Run cell ``index`` of the open notebook with Shift+Enter (:func:`start_until`) and wait until its own
    prompt changes ("[*]:" or a number: the kernel has the cell)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputArea-prompt")
    before = prompt.text_content()

    def trigger() -> None:
        cell.click()
        page.keyboard.press("Shift+Enter")

    start_until(page, trigger, lambda: prompt.text_content() != before, dialogs,
                f"cell {index} (prompt {before!r})")


def chromium_executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def chromium_page(playwright, *, width: int = 1280, height: int = 900) -> Iterator[object]:
    """A page in a headless Chromium with a fresh profile; closed (profile removed) afterwards."""
    with tempfile.TemporaryDirectory(prefix="mhalab-chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium_executable(), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab_server(root: Path, state: Path, *, python: str | os.PathLike = sys.executable,
                      env: Mapping[str, str | None] | None = None, args: Sequence[str] = (),
                      timeout: float = 120) -> Iterator[tuple[str, str, Path]]:
    """A JupyterLab server on localhost serving ``root``, run by ``python``, its settings (no news or update
    checks: nothing outside localhost is contacted), workspaces and runtime files under ``state``; ``env``
    adds variables to this process's (None removes one), ``args`` adds options. Yields (base_url, token, log);
    afterwards the server and its kernels are stopped."""
    settings = state / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    no_news = {"fetchNews": "false", "checkForUpdates": False}
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(no_news))
    # Every cell in the page, not only those scrolled into view: the tests find cells and outputs in the DOM.
    tracker = state / "lab-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    variables = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(state / "lab-settings"),
                     JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"), JUPYTER_RUNTIME_DIR=str(state / "runtime"))
    for name, value in (env or {}).items():
        if value is None:
            variables.pop(name, None)
        else:
            variables[name] = value
    port, token = _free_port(), uuid.uuid4().hex
    command = [str(python), "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0", *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = state / "jupyterlab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=root, env=variables, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"JupyterLab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group: it and its kernels
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
