"""Every layer x head at once, as thumbnails (bertviz's "model view", Vig 2019), tied to a head explorer.

One mosaic image of all ``[query, key]`` maps of a :class:`~mhalab.widgets.HeadExplorer`'s text: layers are
rows, heads columns, with a wider gap between groups of heads that share a K/V head (grouped-query
attention). Sink heads (Xiao et al. 2023) have an orange frame, by a measured criterion: at least
:data:`SINK_THRESHOLD` of the attention of queries 1..T-1 on the first token (``first-token`` score). The
picked head has a red frame, the heads sharing its K/V head dashed ones, and the explorer shows it. The
"hide" toggle draws every map without the first token and [CLS]/[SEP], rows renormalised over the keys left.

Core ipywidgets only: a head is picked with the layer and head sliders under the mosaic (a plain
``ipywidgets.Image`` reports no click position). Viewers without widgets get a still picture.
"""

from __future__ import annotations

import base64
import io

import numpy as np

from ..arguments import validate_index
from ..head_data import hide_keys
from ..plotting import DPI, short_label
from .display import still_png, widgets_available
from .heads import HeadExplorer

__all__ = ["ModelView", "model_view", "SINK_THRESHOLD"]

#: A head is a sink head when at least this fraction of its attention (queries 1..T-1) is on the first token.
SINK_THRESHOLD = 0.5
SMALLEST, LARGEST = 16, 72  # a thumbnail's side, in mosaic pixels = CSS pixels (drawn at 1.5 device pixels each)
TALLEST = 900  # CSS pixels: a deep model gets smaller thumbnails rather than a taller picture
GAP, GROUP_GAP = 3, 9  # between thumbnails; between K/V groups (and layers get GAP)
LEFT, RIGHT, BOTTOM = 34, 8, 6  # margins, CSS pixels: the layer labels on the left


class ModelView:
    """All heads of ``explorer``'s model as thumbnails; :meth:`pick` a head to show it in the explorer.

    ``pixels``: a thumbnail's side; by default as large as lets the picture span the explorer's width (and
    stay under :data:`TALLEST`). ``mosaic`` ``[rows, cols, 3]`` float RGB, ``png`` the current picture,
    ``sinks`` the sink heads."""

    STATIC_NOTE = "A still of the model view: run this notebook (Jupyter or Colab) to pick heads."

    def __init__(self, explorer: HeadExplorer, *, pixels: int | None = None) -> None:
        if not isinstance(explorer, HeadExplorer):
            raise TypeError(f"model_view takes a HeadExplorer (head_explorer(model, text)), "
                            f"got {type(explorer).__name__}")
        self.explorer = explorer
        # by default a little inside the explorer's width, so that the two line up
        self.pixels = self._fitting_pixels(explorer.css_width - 24) if pixels is None else pixels
        self.layer, self.head = explorer.layer, explorer.head
        self._widget = None
        explorer.observe(self.refresh)  # new text in the explorer: redraw here too
        self.refresh()

    # ------------------------------------------------------------------ layout
    @property
    def group_size(self) -> int:
        data = self.explorer.data  # without grouped-query attention, one group of all heads (no K/V labels)
        G = data.n_key_value_heads
        return data.n_heads // G if G != data.n_heads else data.n_heads

    def _fitting_pixels(self, width: int) -> int:
        """The largest thumbnail side in ``[SMALLEST, LARGEST]`` that fits ``width`` CSS pixels and :data:`TALLEST`."""
        data = self.explorer.data
        group_gaps = (data.n_heads // self.group_size - 1) * (GROUP_GAP - GAP) if self.group_size < data.n_heads else 0
        across = (width - LEFT - RIGHT - group_gaps) // data.n_heads - GAP
        down = (TALLEST - self._top - BOTTOM) // data.n_layers - GAP
        return int(max(SMALLEST, min(LARGEST, across, down)))

    @property
    def _top(self) -> int:
        """The top margin, CSS pixels: the header's four lines, the head labels and (GQA) the K/V labels."""
        return 96 if self.group_size < self.explorer.data.n_heads else 80

    def cell_origin(self, layer: int, head: int) -> tuple[int, int]:
        """(row, column) of the top-left pixel of a head's thumbnail in :attr:`mosaic`."""
        group = head // self.group_size
        column = head * (self.pixels + GAP) + group * (GROUP_GAP - GAP)
        return layer * (self.pixels + GAP), column

    @property
    def sinks(self) -> list[tuple[int, int]]:
        """Sink heads: first-token score >= :data:`SINK_THRESHOLD` on this text."""
        first = self.explorer.data.scores["first-token"]
        return [(int(l), int(h)) for l, h in zip(*np.nonzero(first >= SINK_THRESHOLD))]

    def _build_mosaic(self) -> np.ndarray:
        from matplotlib import colormaps

        data, P = self.explorer.data, self.pixels
        rows = data.n_layers * (P + GAP) - GAP
        cols = self.cell_origin(0, data.n_heads - 1)[1] + P
        mosaic = np.ones((rows, cols, 3))
        qi = np.arange(P) * data.T // P  # nearest-neighbour resize of a [T, S] map to P x P
        ki = np.arange(P) * data.S // P
        weights = data.attention[:, 0]  # [N, H, T, S]
        if self.explorer.hide_special:
            weights = hide_keys(weights, data.special_keys())
        cells = colormaps["viridis"](weights[:, :, qi][:, :, :, ki])[..., :3]  # [N, H, P, P, 3], one colormap call
        for l in range(data.n_layers):
            for h in range(data.n_heads):
                r, c = self.cell_origin(l, h)
                mosaic[r : r + P, c : c + P] = cells[l, h]
        return mosaic

    # ------------------------------------------------------------------ figure
    def refresh(self) -> None:
        """Redraw after new text or the toggle: the mosaic, the sink frames, the header. The figure, its axes
        and labels are built once (the mosaic's size does not depend on the text)."""
        from matplotlib.patches import Rectangle

        ex, data = self.explorer, self.explorer.data
        self.mosaic = self._build_mosaic()
        if getattr(self, "figure", None) is None:
            self._build_figure()
        self._image.set_data(self.mosaic)
        for patch in self._sink_frames:
            patch.remove()
        P = self.pixels
        self._sink_frames = [self._ax.add_patch(Rectangle((c - 1, r - 1), P + 1, P + 1, fill=False,
                                                          edgecolor="tab:orange", lw=0.9))
                             for r, c in (self.cell_origin(l, h) for l, h in self.sinks)]
        hidden = "hidden: first token, [CLS], [SEP] (rows renormalised)" if ex.hide_special else "all keys shown"
        rest = [hidden, f"orange: sink head (>= {SINK_THRESHOLD:.0%} on the first token): {len(self.sinks)} of "
                        f"{data.n_layers * data.n_heads}",
                "red: picked head" + ("; dashed: same K/V head" if self.group_size < data.n_heads else "")]
        counts = f"{data.n_layers} layers x {data.n_heads} heads, {data.T} tokens"
        renderer, room = self.figure.canvas.get_renderer(), self.figure.bbox.width * (1 - 4 / self._css_width)
        for limit in range(60, 8, -4):  # which text (a printed count may be older), cut until the line fits
            text = "" if data.text is None else f" of {short_label(data.text, limit)!r}"
            self._header.set_text("\n".join([counts + text, *rest]))
            if data.text is None or self._header.get_window_extent(renderer).x1 <= room:
                break
        self.pick(self.layer, self.head, follow=False)

    def _build_figure(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        data = self.explorer.data
        rows, cols = self.mosaic.shape[:2]
        gqa = self.group_size < data.n_heads
        left, top, bottom, right = LEFT, self._top, BOTTOM, RIGHT
        width, height = max(cols + left + right, 300), rows + top + bottom  # one CSS pixel per mosaic pixel
        self.figure = Figure(figsize=(width / DPI, height / DPI), dpi=1.5 * DPI)
        FigureCanvasAgg(self.figure)
        self._css_width = round(width)
        ax = self.figure.add_axes([left / width, bottom / height, cols / width, rows / height])
        self._image = ax.imshow(self.mosaic, interpolation="nearest", aspect="auto")
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.axis("off")
        P = self.pixels
        step = 1 if P >= 12 else 2
        for l in range(0, data.n_layers, step):
            ax.text(-4, self.cell_origin(l, 0)[0] + P / 2, f"L{l}", ha="right", va="center", fontsize=7)
        for h in range(data.n_heads):
            ax.text(self.cell_origin(0, h)[1] + P / 2, -4, f"H{h}", ha="center", va="bottom", fontsize=7)
        if gqa:  # grouped-query attention: name the K/V head above each group
            for g in range(data.n_heads // self.group_size):
                first = self.cell_origin(0, g * self.group_size)[1]
                last = self.cell_origin(0, (g + 1) * self.group_size - 1)[1] + P
                ax.plot([first, last], [-16, -16], color="0.3", lw=0.8, clip_on=False)
                ax.text((first + last) / 2, -18, f"K/V head {g}", ha="center", va="bottom", fontsize=7, color="0.3")
        self._header = self.figure.text(4 / width, 1 - 3 / height, "", fontsize=7, va="top", linespacing=1.3)
        self._ax = ax
        self._frames, self._sink_frames = [], []

    def pick(self, layer: int | None = None, head: int | None = None, *, follow: bool = True) -> None:
        """Frame head (``layer``, ``head``) and its K/V group-mates; ``follow``: show it in the explorer."""
        from matplotlib.patches import Rectangle

        ex = self.explorer
        layer = self.layer if layer is None else validate_index("layer", layer, ex.data.n_layers)
        head = self.head if head is None else validate_index("head", head, ex.data.n_heads)  # both checked, then set
        self.layer, self.head = layer, head
        for frame in self._frames:
            frame.remove()
        P = self.pixels
        self._frames = []
        for h in ex.data.kv_group(self.head):
            r, c = self.cell_origin(self.layer, h)
            main = h == self.head
            self._frames.append(self._ax.add_patch(Rectangle(
                (c - 1.5, r - 1.5), P + 2, P + 2, fill=False, edgecolor="red", lw=2.0 if main else 1.0,
                ls="-" if main else "--", clip_on=False)))
        buffer = io.BytesIO()
        self.figure.canvas.draw()
        from PIL import Image

        rgb = np.asarray(self.figure.canvas.buffer_rgba())[..., :3]  # [height, width, 3]
        Image.fromarray(rgb).save(buffer, format="png", compress_level=1)
        self.png = buffer.getvalue()
        if follow and (ex.layer, ex.head) != (self.layer, self.head):
            ex.update(layer=self.layer, head=self.head)
        if self._widget is not None:
            self._image_widget.value = self.png
            self._image_widget.layout.width = f"{self._css_width}px"
            for name, control in self._controls.items():
                control.value = getattr(self, name) if name != "hide_special" else ex.hide_special

    def set_hidden(self, hide: bool) -> None:
        """Hide (or show again) the attention to the first token and [CLS]/[SEP], here and in the explorer."""
        self.explorer.update(hide_special=bool(hide))
        self.refresh()

    # ----------------------------------------------------------------- widgets
    @property
    def widget(self):
        """Layer and head sliders (picking a head), the hide toggle, and the mosaic."""
        if self._widget is None:
            import ipywidgets as W

            ex = self.explorer
            style = {"description_width": "initial"}  # as wide as the words: "pick layer" is never cut
            self._controls = {
                "layer": W.IntSlider(value=self.layer, min=0, max=ex.data.n_layers - 1, description="pick layer",
                                     style=style),
                "head": W.IntSlider(value=self.head, min=0, max=ex.data.n_heads - 1, description="pick head",
                                    style=style),
                "hide_special": W.Checkbox(value=ex.hide_special, indent=False, layout=W.Layout(width="auto"),
                                           description="hide the first token, [CLS], [SEP] (rows renormalised)"),
            }
            for control in self._controls.values():
                control.observe(self._on_change, names="value")
            self._image_widget = W.Image(value=self.png, format="png", layout=W.Layout(width=f"{self._css_width}px"))
            self._image_widget.add_class("mhalab-model-map")
            self._widget = W.VBox([W.HBox([self._controls["layer"], self._controls["head"]]),
                                   self._controls["hide_special"], self._image_widget])
            self._widget.add_class("mhalab-model-view")
        return self._widget

    def _on_change(self, change) -> None:
        name = next(n for n, control in self._controls.items() if control is change["owner"])
        if name == "hide_special":
            if change["new"] != self.explorer.hide_special:
                self.set_hidden(change["new"])
        elif change["new"] != getattr(self, name):
            self.pick(**{name: change["new"]})

    def static_png(self) -> bytes:
        """The current picture with :attr:`STATIC_NOTE` under it (wrapped to its width)."""
        return still_png(self.png, self.figure.dpi / DPI, self.STATIC_NOTE)

    def _repr_mimebundle_(self, include=None, exclude=None) -> tuple[dict, dict]:
        """The widget where a kernel runs, and always the still (``image/png``) for viewers without widgets."""
        bundle = {"image/png": base64.b64encode(self.static_png()).decode("ascii"),
                  "text/plain": f"{self!r}\n{self.STATIC_NOTE}"}
        if widgets_available():
            bundle["application/vnd.jupyter.widget-view+json"] = {"version_major": 2, "version_minor": 0,
                                                                  "model_id": self.widget.model_id}
        return bundle, {"image/png": {"width": self._css_width}}

    def __repr__(self) -> str:
        data = self.explorer.data
        return (f"<ModelView: {data.n_layers} layers x {data.n_heads} heads on {data.T} tokens, "
                f"{len(self.sinks)} sink heads, "
                f"picked layer {self.layer} head {self.head}>")


def model_view(explorer: HeadExplorer, **options) -> ModelView:
    """Every head of ``explorer``'s model as thumbnails (display it); picking one shows it in the explorer."""
    return ModelView(explorer, **options)
