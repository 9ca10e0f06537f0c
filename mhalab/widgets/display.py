"""How the explorers show themselves: the live widget where a Jupyter kernel runs, and always a still
picture with a note under it, for viewers that cannot draw widgets (GitHub, nbviewer, the course website).
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["widgets_available", "still_png", "widget_bundle"]


def still_png(png: bytes, scale: float, note: str) -> bytes:
    """``png`` with ``note`` written under it (``scale``: pixels per CSS pixel), for viewers without widgets;
    the note wraps onto as many lines as the picture's width needs, so no word is cut off."""
    from matplotlib import font_manager
    from PIL import Image, ImageDraw, ImageFont

    picture = Image.open(io.BytesIO(png)).convert("RGB")
    font = ImageFont.truetype(font_manager.findfont("DejaVu Sans"), round(12 * scale))
    lines = [""]  # the note wrapped to the picture's width, so that a narrow picture does not cut it off
    for word in note.split():
        wider = f"{lines[-1]} {word}".strip()
        if lines[-1] and font.getlength(wider) > picture.width - 12 * scale:
            lines.append(word)
        else:
            lines[-1] = wider
    step = round(17 * scale)
    still = Image.new("RGB", (picture.width, picture.height + step * len(lines) + round(3 * scale)), "white")
    still.paste(picture, (0, 0))
    for i, line in enumerate(lines):
        where = (6 * scale, picture.height + 3 * scale + i * step)
        ImageDraw.Draw(still).text(where, line, fill=(70, 70, 70), font=font)
    buffer = io.BytesIO()
    still.save(buffer, format="png")
    return buffer.getvalue()


def widget_bundle(owner: Any, still: bytes, width: int) -> tuple[dict, dict]:
    """The widget view where a kernel runs, and always the still picture for viewers that cannot draw widgets."""
    import base64

    bundle = {"image/png": base64.b64encode(still).decode("ascii"), "text/plain": f"{owner!r}\n{owner.STATIC_NOTE}"}
    if widgets_available():
        bundle["application/vnd.jupyter.widget-view+json"] = {"version_major": 2, "version_minor": 0,
                                                              "model_id": owner.widget.model_id}
    return bundle, {"image/png": {"width": width}}  # shown at CSS size: sharp, not stretched


def widgets_available() -> bool:
    """True when ipywidgets imports and a Jupyter kernel (so a frontend that can draw widgets) is running."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None

