"""The formation explorer: a training-step slider over a :class:`~mhalab.formation.FormationRecorder`, to
watch heads form during training. Like the head explorer it only looks up what was recorded and re-renders
one off-screen matplotlib figure; viewers that cannot draw widgets show a still picture
(:mod:`mhalab.widgets.display`).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..arguments import validate_index
from ..plotting import DPI
from .display import still_png, widget_bundle

__all__ = ["FormationExplorer", "formation_explorer"]


class FormationExplorer:
    """A training-step slider over a :class:`~mhalab.formation.FormationRecorder`: the chosen head's attention
    on the recorder's fixed example at each recorded step, beside that head's induction and previous-token
    scores over training (a line marks the step shown). Everything is looked up in the recorder; nothing is
    recomputed. ``task`` labels the tokens. ``png`` is the current picture.
    """

    STATIC_NOTE = "A still of the formation explorer: run this notebook (Jupyter or Colab) to move its slider."

    def __init__(self, recorder: Any, task: Any = None, *, layer: int = 0, head: int = 0, step: int | None = None,
                 figsize: tuple[float, float] = (9.0, 3.6)) -> None:
        self.steps = list(recorder.steps)
        if not self.steps:
            raise ValueError("the recorder has recorded nothing: train with callback=recorder first")
        self.patterns = recorder.patterns.numpy()  # [K, N, H, T, T]
        self.scores = {name: recorder.score(name).numpy() for name in ("induction", "previous-token")}  # [K, N, H]
        self.repeated_loss = recorder.loss("repeated").numpy()  # [K]
        _, self.n_layers, self.n_heads, self.T, _ = self.patterns.shape
        labels = getattr(task, "token_labels", None) or (lambda ids: [str(int(t)) for t in ids])
        self.labels = list(labels(recorder.example))
        self.layer, self.head, self.step = 0, 0, self.steps[-1]
        self._widget = None
        self._build_figure(figsize)
        self.update(layer=layer, head=head, step=self.steps[-1] if step is None else step)

    def _build_figure(self, figsize: tuple[float, float]) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=figsize, dpi=1.5 * DPI)  # pyplot-free: never shown twice
        self._css_width = round(figsize[0] * DPI)
        FigureCanvasAgg(self.figure)
        self.figure.subplots_adjust(left=0.07, right=0.98, top=0.88, bottom=0.15, wspace=0.35)
        self.ax_map, self.ax_curve = self.figure.subplots(1, 2, width_ratios=[1, 1.2])
        T = self.T
        self.image = self.ax_map.imshow(np.zeros((T, T)), vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ticks = range(0, T, max(1, T // 8))
        self.ax_map.set(xticks=ticks, yticks=ticks, xlabel="key position", ylabel="query position")
        self.ax_map.tick_params(labelsize=7)
        self.ax_map.xaxis.label.set_fontsize(8)
        self.ax_map.yaxis.label.set_fontsize(8)
        self.map_title = self.ax_map.set_title("", fontsize=9)
        self.lines = {name: self.ax_curve.plot(self.steps, np.zeros(len(self.steps)), color=color, label=name)[0]
                      for name, color in (("induction", "tab:red"), ("previous-token", "tab:blue"))}
        self.marker = self.ax_curve.axvline(self.steps[-1], color="k", lw=0.8, ls=":")
        self.ax_curve.set(ylim=(0, 1), xlabel="training step", ylabel="score (fraction of attention)")
        self.ax_curve.xaxis.label.set_fontsize(8)
        self.ax_curve.yaxis.label.set_fontsize(8)
        self.ax_curve.tick_params(labelsize=7)
        self.ax_curve.legend(fontsize=7, loc="upper left", frameon=False)
        self.curve_title = self.ax_curve.set_title("", fontsize=9)

    def _render(self) -> bytes:
        from PIL import Image

        self.figure.canvas.draw()
        rgba = np.asarray(self.figure.canvas.buffer_rgba())  # [height, width, 4] uint8
        buffer = io.BytesIO()
        Image.fromarray(rgba[..., :3]).save(buffer, format="png", compress_level=1)
        return buffer.getvalue()

    def update(self, layer: int | None = None, head: int | None = None, step: int | None = None) -> None:
        """Show another head or recorded step (``step``: one of :attr:`steps`)."""
        for name, value, size in (("layer", layer, self.n_layers), ("head", head, self.n_heads)):
            if value is not None:
                setattr(self, name, validate_index(name, value, size))
        if step is not None:
            if step not in self.steps:
                raise ValueError(f"step {step!r} was not recorded; the recorded steps are {self.steps[0]}, "
                                 f"{self.steps[1] if len(self.steps) > 1 else ''} ... {self.steps[-1]}")
            self.step = int(step)
        l, h, k = self.layer, self.head, self.steps.index(self.step)
        self.image.set_data(self.patterns[k, l, h])
        induction, previous = (float(self.scores[name][k, l, h]) for name in ("induction", "previous-token"))
        self.map_title.set_text(f"layer {l} head {h} at step {self.step}")
        for name, line in self.lines.items():
            line.set_ydata(self.scores[name][:, l, h])
        self.marker.set_xdata([self.step, self.step])
        self.curve_title.set_text(f"induction {induction:.2f}, previous-token {previous:.2f}, "
                                  f"repeat loss {float(self.repeated_loss[k]):.2f}")
        self.png = self._render()
        if self._widget is not None:
            self._image_widget.value = self.png
            for name, control in self._controls.items():
                control.value = getattr(self, name)

    @property
    def widget(self):
        """The ipywidgets UI (built on first use): a step slider, layer and head sliders, the picture."""
        if self._widget is None:
            import ipywidgets as W

            style = {"description_width": "40px"}
            self._controls = {
                "step": W.SelectionSlider(options=self.steps, value=self.step, description="step", style=style,
                                          layout=W.Layout(width="420px")),
                "layer": W.IntSlider(value=self.layer, min=0, max=self.n_layers - 1, description="layer", style=style),
                "head": W.IntSlider(value=self.head, min=0, max=self.n_heads - 1, description="head", style=style),
            }
            self._image_widget = W.Image(value=self.png, format="png", layout=W.Layout(width=f"{self._css_width}px"))
            for control in self._controls.values():
                control.observe(self._on_change, names="value")
            self._widget = W.VBox([W.HBox(list(self._controls.values())), self._image_widget])
            self._widget.add_class("mhalab-formation-explorer")
        return self._widget

    def _on_change(self, change) -> None:
        name = change["owner"].description
        if change["new"] != getattr(self, name):
            self.update(**{name: change["new"]})

    def static_png(self) -> bytes:
        """The current picture with :attr:`STATIC_NOTE` under it, as PNG bytes."""
        return still_png(self.png, self.figure.dpi / DPI, self.STATIC_NOTE)

    def _repr_mimebundle_(self, include=None, exclude=None) -> tuple[dict, dict]:
        return widget_bundle(self, self.static_png(), self._css_width)

    def __repr__(self) -> str:
        k = self.steps.index(self.step)
        return (f"<FormationExplorer: {len(self.steps)} recorded steps (0..{self.steps[-1]}), showing layer "
                f"{self.layer} head {self.head} at step {self.step}: induction "
                f"{float(self.scores['induction'][k, self.layer, self.head]):.2f}>")


def formation_explorer(recorder: Any, task: Any = None, **options: Any) -> FormationExplorer:
    """Build a :class:`FormationExplorer`; display it (e.g. as a cell's last line) to get the slider."""
    return FormationExplorer(recorder, task, **options)
