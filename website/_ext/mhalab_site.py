"""Sphinx tweaks for the course website (website/_config.yml loads this as a local extension)."""


def _drop_thebe(app, pagename, templatename, context, doctree):
    """Jupyter Book 1 always adds sphinx-thebe (live code, loaded from a CDN on demand), and its inline
    script declares THEBE_JS_URL twice on every page, a JavaScript error. The site is static: drop it."""
    def is_thebe(script) -> bool:
        filename = str(getattr(script, "filename", script) or "")
        body = str(getattr(script, "attributes", {}).get("body", ""))
        return "thebe" in filename.lower() or "thebe" in body.lower()

    context["script_files"] = [s for s in context.get("script_files", []) if not is_thebe(s)]


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
