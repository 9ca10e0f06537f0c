"""Sliders over precomputed attention (ipywidgets + matplotlib, no JavaScript of our own), one module per
explorer:

- :mod:`~mhalab.widgets.heads`: :func:`head_explorer`, text or a task batch -> every layer x head;
- :mod:`~mhalab.widgets.formation`: :func:`formation_explorer`, watching heads form during training;
- :mod:`~mhalab.widgets.display`: the live widget where a kernel runs, a still picture everywhere else.

Importing this package imports no ipywidgets (each explorer imports it when its widget is first built) and
touches no GPU.
"""

from .display import widgets_available
from .formation import FormationExplorer, formation_explorer
from .heads import MAX_TOKENS, SPECIAL_LABELS, HeadExplorer, head_explorer, hide_keys

__all__ = ["HeadExplorer", "head_explorer", "FormationExplorer", "formation_explorer", "widgets_available", "MAX_TOKENS",
           "SPECIAL_LABELS", "hide_keys"]
