"""The head explorer: every layer and head of a model with sliders, an attention heat map, the head's scores
and what removing it costs.

``head_explorer(model, "any text")`` runs a pretrained model (``model.tokenizer``: MiniLM, SmolLM2) on the
learner's own text, at most :data:`MAX_TOKENS` tokens; its text box re-runs the model when Enter is pressed.

A slider move only looks up arrays computed once when the explorer is built, changes the data of one
off-screen matplotlib figure and re-renders it to the PNG an ``ipywidgets.Image`` shows: core ipywidgets
(7.7 and 8), no JavaScript of our own. Viewers that cannot draw widgets show a still picture instead
(:mod:`mhalab.widgets.display`). ``benchmarks/explorer.py`` times it.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from ..ablation import AblationTable
from ..arguments import validate_index
from ..head_data import AttentionLayers, HeadData, head_data
from ..head_roles import NO_ROLE
from ..plotting import DPI, fit_tick_labels, relation_style, short_label
from .display import still_png, widget_bundle

__all__ = ["HeadExplorer", "head_explorer", "MAX_TOKENS"]

#: The most tokens the explorer takes from typed text (special tokens included): the maps stay readable
#: and a re-run answers within a second on two CPU cores (``benchmarks/explorer.py``).
MAX_TOKENS = 32
#: How many characters of a token label an axis shows.
LABEL_CHARS = 10


class HeadExplorer:
    """Sliders over every head of a model (layer, head, example, highlight), answered from :attr:`data`.

    ``batch``: a task ``Batch`` (its ``sources`` give relation scores) or ``[B, T]`` token ids; scores and
    ablation effects use the whole batch, the example slider its first ``examples``. ``task``: for token
    labels and ``task.metrics``. ``ablation``: zero each head once (needs ``task``), or an
    :class:`~mhalab.ablation.AblationTable` computed on the same batch. ``figsize``: inches, shown at
    :data:`~mhalab.plotting.DPI` CSS pixels each and rendered at 1.5x that, sharp on HiDPI screens.
    ``data`` is the :class:`~mhalab.head_data.HeadData` every view reads; ``png`` the current picture.
    """

    def __init__(self, model: nn.Module, batch: Any, task: Any = None, *, examples: int = 8,
                 ablation: bool | AblationTable = True, figsize: tuple[float, float] = (9.0, 3.8),
                 layer: int = 0, head: int = 0) -> None:
        self.model = model
        self.tokenizer = getattr(model, "tokenizer", None) if isinstance(batch, str) else None
        self._layers = AttentionLayers(model)  # the attention modules and hook names, looked up once
        self._observers: list[Callable[[], None]] = []
        self._widget = None
        self.hide_special = False
        if isinstance(batch, str):
            if self.tokenizer is None:
                raise TypeError(f"{type(model).__name__} has no .tokenizer to turn text into tokens: pass token ids "
                                "or a task Batch, or a pretrained model (mhalab.pretrained.load_minilm/load_smollm2)")
            self.data = self._run(batch)
        else:
            self.data = head_data(model, batch, task, examples=examples, ablation=ablation, layers=self._layers)
        self.layer, self.head, self.example = 0, 0, 0
        self.highlight = NO_ROLE
        self._build_figure(figsize)
        self.update(layer=layer, head=head)

    def _run(self, text: str) -> HeadData:
        """The model on ``text``; ValueError (shown in the widget) when empty or over :data:`MAX_TOKENS` tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("the text box is empty: type a sentence and press Enter")
        encoded = self.tokenizer(text)
        tokens = getattr(encoded, "tokens", encoded)  # MiniLM: an Encoding; SmolLM2: a [1, T] tensor
        n = tokens.size(1)
        if n > MAX_TOKENS:
            raise ValueError(f"that text is {n} tokens; the explorer takes at most {MAX_TOKENS} (special tokens "
                             f"such as {self.tokenizer.token_labels(tokens[0, :1])[0]!r} included): shorten it and "
                             "press Enter")
        return head_data(self.model, tokens, self.tokenizer, examples=1, ablation=False, text=text, layers=self._layers)

    def set_text(self, text: str) -> None:
        """Run the model on new ``text`` (explorers built from text only) and redraw, keeping layer and head;
        then tell every view that :meth:`observe` s this explorer."""
        if self.tokenizer is None:
            raise TypeError("this explorer was built from token ids, not text: head_explorer(model, 'some text') "
                            "takes text (with a pretrained model)")
        self.data = self._run(text)  # raises before anything changes
        self.example = 0
        self._reshape()
        self.update()
        for callback in self._observers:
            callback()

    def observe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each new text (another view of the same data, e.g. the model view, redraws)."""
        self._observers.append(callback)

    # ------------------------------------------------------------------ figure
    def _build_figure(self, figsize: tuple[float, float]) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        # A pyplot-free Figure: it never pops up or gets shown twice by the inline backend.
        self.figure = Figure(figsize=figsize, dpi=1.5 * DPI)
        FigureCanvasAgg(self.figure)
        self.css_width = round(figsize[0] * DPI)  # shown at this width whatever the pixel density
        self.figure.subplots_adjust(left=0.1, right=0.97, top=0.88, bottom=0.3, wspace=0.55)
        self.ax_map, self.ax_bar = self.figure.subplots(1, 2, width_ratios=[1.25, 1])

        T, S = self.data.T, self.data.S
        self.image = self.ax_map.imshow(np.zeros((T, S)), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto",
                                        interpolation="nearest")
        bar = self.figure.colorbar(self.image, ax=self.ax_map, fraction=0.046, pad=0.02)
        bar.set_label("attention weight", fontsize=8)
        bar.ax.tick_params(labelsize=7)
        self.ax_map.set_xlabel("key (attended to)", fontsize=8)
        self.ax_map.set_ylabel("query", fontsize=8)
        self.ax_map.tick_params(labelsize=7, length=0)
        self.markers = self.ax_map.scatter([], [], s=40, facecolors="none", edgecolors="red", linewidths=1.2)
        self.map_title = self.ax_map.set_title("", fontsize=9)

        y = np.arange(len(self.data.bar_names))
        self.bars = self.ax_bar.barh(y, np.zeros(len(y)), color="tab:gray")
        self.ax_bar.set_yticks(y, self.data.bar_names, fontsize=8)
        self.ax_bar.invert_yaxis()
        self.ax_bar.set_xlim(0, 1)
        self.ax_bar.axvline(self.data.threshold, color="k", lw=0.6, ls=":")
        over = " (whole text)" if self.data.text is not None else " (whole batch)"
        self.ax_bar.set_xlabel("fraction of attention" + over, fontsize=8)
        self.ax_bar.tick_params(axis="x", labelsize=7)
        self.bar_text = [self.ax_bar.text(0.0, i, "", va="center", fontsize=7) for i in y]
        self.bar_title = self.ax_bar.set_title("", fontsize=9)
        self.footer = self.figure.text(0.01, 0.02, "", fontsize=8, family="monospace", va="bottom")
        self._labelled_example = -1
        # Blitting: everything that changes with a slider is "animated", i.e. left out of the full draw.
        # The full draw (axes, ticks, colour bar) is cached as a background; a move restores it and
        # draws only these artists on top, which is several times faster than redrawing the figure.
        self._dynamic = [self.image, self.markers, self.map_title, *self.bars, *self.bar_text, self.bar_title,
                         self.footer]
        for artist in self._dynamic:
            artist.set_animated(True)

    def _reshape(self) -> None:
        """Fit the map to a new length in the same axes (new tick labels at the next update): far cheaper
        than new axes, whose ticks matplotlib would build again one by one."""
        T, S = self.data.T, self.data.S
        self.image.set_data(np.zeros((T, S)))
        self.image.set_extent((-0.5, S - 0.5, T - 0.5, -0.5))
        self.ax_map.set_xlim(-0.5, S - 0.5)
        self.ax_map.set_ylim(T - 0.5, -0.5)
        self._labelled_example = -1

    def _render(self, *, full: bool) -> bytes:
        """Draw the dynamic artists over the cached background (redrawn when ``full``); return PNG bytes."""
        from PIL import Image

        canvas = self.figure.canvas
        if full:  # always at the first update(): no example has its tick labels yet
            canvas.draw()  # everything except the animated artists
            self._background = canvas.copy_from_bbox(self.figure.bbox)
        else:
            canvas.restore_region(self._background)
        for artist in self._dynamic:
            self.figure.draw_artist(artist)
        rgba = np.asarray(canvas.buffer_rgba())  # [height, width, 4] uint8, a view of the canvas
        buffer = io.BytesIO()
        Image.fromarray(rgba[..., :3]).save(buffer, format="png", compress_level=1)  # fast, still lossless
        return buffer.getvalue()

    def update(self, layer: int | None = None, head: int | None = None, example: int | None = None,
               highlight: str | None = None, hide_special: bool | None = None) -> None:
        """Show another head/example/highlight: array lookups, the artists' data, one PNG render.
        ``hide_special``: draw the map without the first token and [CLS]/[SEP] (:meth:`special_keys`), rows
        renormalised over the keys left; the scores always count all keys."""
        if hide_special is not None:
            self.hide_special = bool(hide_special)
        for name, value in (("layer", layer), ("head", head), ("example", example)):
            if value is not None:
                setattr(self, name, validate_index(name, value, self.sizes[name]))
        if highlight is not None:
            options = self.highlight_options
            if highlight not in options:
                raise ValueError(f"highlight must be one of {options}, got {highlight!r}")
            self.highlight = highlight
        l, h, e = self.layer, self.head, self.example

        self.image.set_data(self.data.shown_map(l, h, e, hide_special=self.hide_special))  # [T, S]
        relabel = e != self._labelled_example
        if relabel:  # tick labels change only with the example; they live in the cached background
            labels = [short_label(t, LABEL_CHARS) for t in self.data.labels[e]]
            fit_tick_labels(self.ax_map, "x", labels)  # flat, upright, or every k-th: never overlapping
            fit_tick_labels(self.ax_map, "y", labels[-self.data.T :])
            self._labelled_example = e
        keys = self.data.keys[self.highlight][e]  # [T]
        queries = np.flatnonzero(keys >= 0)
        self.markers.set_offsets(np.stack([keys[queries], queries], axis=1))  # [P, 2] (key, query) points
        where = f"layer {l}, head {h}" + (f", example {e}" if self.data.n_examples > 1 else "")
        names = ", ".join(short_label(self.data.labels[e][k], LABEL_CHARS) for k in self.data.special_keys(e))
        hidden = f" ({names} hidden)" if self.hide_special else ""
        self.map_title.set_text(f"{where}: {self.data.role(l, h)}{hidden}")

        for i, name in enumerate(self.data.bar_names):
            value = float(self.data.scores[name][l, h])
            self.bars[i].set_width(value)
            colour = "tab:red" if name == self.highlight else relation_style(name, self.data.relations)[1]
            self.bars[i].set_color(colour)
            self.bar_text[i].set_position((min(value, 0.8) + 0.02, i))
            self.bar_text[i].set_text(f"{value:.2f}")
        entropy, distance = float(self.data.scores["entropy"][l, h]), float(self.data.scores["distance"][l, h])
        self.bar_title.set_text(f"scores: entropy {entropy:.2f} nats, distance {distance:.1f}")
        self.footer.set_text(self.footer_text(l, h))

        self.png = self._render(full=relabel)
        if self._widget is not None:
            self._image_widget.value = self.png
            for name, control in self._controls.items():  # follow update(); no redraw (_on_change)
                control.value = getattr(self, name)

    @property
    def sizes(self) -> dict[str, int]:
        """How many layers, heads and examples the sliders offer."""
        return {"layer": self.data.n_layers, "head": self.data.n_heads, "example": self.data.n_examples}

    @property
    def highlight_options(self) -> list[str]:
        return [NO_ROLE] + self.data.bar_names

    def footer_text(self, layer: int, head: int) -> str:
        """The line under the picture: the ablation's effect when there is one, else which heads share this
        head's keys and values (grouped-query attention) and its share of attention on the first token."""
        if self.data.ablation is not None:
            return self.data.ablation_text(layer, head)
        parts = []
        group = self.data.kv_group(head)
        if len(group) > 1:
            others = ", ".join(str(g) for g in group if g != head)
            parts.append(f"K/V head {head // len(group)} of {self.data.n_key_value_heads}, shared with heads {others}")
        first = float(self.data.scores["first-token"][layer, head])
        parts.append(f"{first:.0%} of its attention on the first token (queries 1..{self.data.T - 1})")
        return "   |  ".join(parts)

    # ----------------------------------------------------------------- widgets
    @property
    def widget(self):
        """The ipywidgets UI (built on first use): sliders, dropdown and the picture."""
        if self._widget is None:
            import ipywidgets as W

            style = {"description_width": "60px"}
            self._controls = {
                name: W.IntSlider(value=getattr(self, name), min=0, max=n - 1, description=name, style=style)
                for name, n in self.sizes.items()
            }
            self._controls["highlight"] = W.Dropdown(options=self.highlight_options, value=self.highlight,
                                                     description="highlight", style=style)
            self._controls["hide_special"] = W.Checkbox(value=self.hide_special, indent=False,  # as wide as its words
                                                        description="hide the first token, [CLS], [SEP]",
                                                        layout=W.Layout(width="auto"))
            width = W.Layout(width=f"{self.css_width}px")
            self._image_widget = W.Image(value=self.png, format="png", layout=width)
            self._image_widget.add_class("mhalab-head-map")
            for control in self._controls.values():
                control.observe(self._on_change, names="value")
            sliders = W.HBox([self._controls[name] for name in ("layer", "head", "example")])
            rows = [sliders, W.HBox([self._controls["highlight"], self._controls["hide_special"],
                                     W.Label("(rows renormalised over the keys left)")])]
            if self.tokenizer is not None:  # built from text: a box to type new text in
                # continuous_update=False: the value changes on Enter (or leaving the box), not per key.
                box = W.Text(value=self.data.text, description="text", continuous_update=False, style=style,
                             layout=W.Layout(width=f"{min(self.css_width, 760)}px"))
                box.add_class("mhalab-text")
                box.observe(self._on_text, names="value")
                self._message = W.HTML(value=self._message_html(""))
                self._message.add_class("mhalab-message")
                rows = [W.HBox([box]), self._message, *rows]
            self._widget = W.VBox([*rows, self._image_widget])
            self._widget.add_class("mhalab-head-explorer")
        return self._widget

    def _message_html(self, error: str) -> str:
        if error:
            return f"<span style='color:#b00'>{html.escape(error)}</span>"
        return html.escape(f"{self.data.T} tokens (at most {MAX_TOKENS}); edit the text and press Enter to re-run "
                           "the model")

    def _on_text(self, change) -> None:
        try:
            self.set_text(change["new"])
        except ValueError as error:  # empty or too long: say so, keep the last picture
            self._message.value = self._message_html(str(error))
            return
        self._message.value = self._message_html("")

    def _on_change(self, change) -> None:
        name = next(n for n, control in self._controls.items() if control is change["owner"])
        if change["new"] != getattr(self, name):  # not update() moving the control to where it already is
            self.update(**{name: change["new"]})

    #: The line under the still picture, for viewers that cannot run the sliders.
    STATIC_NOTE = ("A still of the head explorer: run this notebook (Jupyter or Colab) to move its sliders and "
                   "type text.")

    def static_png(self) -> bytes:
        """The current picture with :attr:`STATIC_NOTE` written under it, as PNG bytes."""
        return still_png(self.png, self.figure.dpi / DPI, self.STATIC_NOTE)

    def _repr_mimebundle_(self, include=None, exclude=None) -> tuple[dict, dict]:
        """The widget view where a kernel runs, and always the still picture (``image/png``, with
        :attr:`STATIC_NOTE`) for viewers that cannot draw widgets (GitHub, nbviewer, the course website)."""
        return widget_bundle(self, self.static_png(), self.css_width)

    def __repr__(self) -> str:
        return (
            f"<HeadExplorer: {self.data.n_layers} layers x {self.data.n_heads} heads, {self.data.n_examples} examples, "
            f"showing layer {self.layer} head {self.head} example {self.example}: "
            f"{self.data.role(self.layer, self.head)}>"
        )


def head_explorer(model: nn.Module, batch: Any, task: Any = None, **options: Any) -> HeadExplorer:
    """Build a :class:`HeadExplorer`; display it (e.g. as a cell's last line) to get the sliders.

    ``batch``: text (a str, for a model with a ``.tokenizer``: MiniLM, SmolLM2; at most :data:`MAX_TOKENS`
    tokens, and a text box to change it), a task ``Batch``, or ``[B, T]`` token ids."""
    return HeadExplorer(model, batch, task, **options)
