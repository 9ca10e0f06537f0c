"""Every view of attention, each taking data computed elsewhere (ipywidgets + matplotlib, no JavaScript of our own):

- :mod:`~mhalab.widgets.heads`: :func:`head_explorer`, text or a task batch -> every layer x head with sliders;
- :mod:`~mhalab.widgets.model_view`: :func:`model_view`, every layer x head as thumbnails, tied to an explorer;
- :mod:`~mhalab.widgets.head_grid`: :func:`head_grid`, every head of one layer as a still figure;
- :mod:`~mhalab.widgets.formation_explorer`: :func:`formation_explorer`, watching heads form during training (over
  a :class:`mhalab.formation.FormationRecorder`);
- :mod:`~mhalab.widgets.display`: the live widget where a kernel runs, a still picture everywhere else.

Importing this package imports no ipywidgets (each view imports it when its widget is first built) and
touches no GPU.
"""

from .display import widgets_available
from .formation_explorer import FormationExplorer, formation_explorer
from .head_grid import head_grid
from .heads import MAX_TOKENS, HeadExplorer, head_explorer
from .model_view import SINK_THRESHOLD, ModelView, model_view

__all__ = ["HeadExplorer", "head_explorer", "ModelView", "model_view", "SINK_THRESHOLD", "head_grid",
           "FormationExplorer", "formation_explorer", "widgets_available", "MAX_TOKENS"]
