"""One way the tests start headless Chromium: Debian's build, driven by Playwright, in a fresh profile."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

#: JavaScript for ``page.wait_for_function``: true once some code cell's prompt shows a number or "*" (the kernel
#: has the cell), in JupyterLab 3 and 4 alike.
CELL_STARTED = ("() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))"
                ".some(p => /\\S/.test(p.textContent.replace(/[\\[\\]: \\u00a0]/g, '')))")


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
