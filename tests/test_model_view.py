"""mhalab.widgets.model_view: every head as a thumbnail, sink heads and K/V groups marked, picking drives the
explorer."""

import base64

import numpy as np
import pytest
from matplotlib import colormaps

from mhalab import widgets
from mhalab.head_data import hide_keys
from mhalab.head_roles import first_token_score
from mhalab.widgets.model_view import SINK_THRESHOLD, model_view


def test_every_head_is_a_thumbnail_of_its_map(text_explorer):
    _, ex = text_explorer
    view = model_view(ex, pixels=ex.data.T)  # one mosaic pixel per query and key: the map itself
    for layer, head in [(0, 0), (1, 3)]:
        r, c = view.cell_origin(layer, head)
        cell = view.mosaic[r : r + ex.data.T, c : c + ex.data.S]
        np.testing.assert_allclose(cell, colormaps["viridis"](ex.data.attention[layer, 0, head])[..., :3])
    # heads 0-1 share a K/V head, as do 2-3: a wider gap between the groups than inside them
    inside = view.cell_origin(0, 1)[1] - view.cell_origin(0, 0)[1]
    between = view.cell_origin(0, 2)[1] - view.cell_origin(0, 1)[1]
    assert between > inside


def test_sink_heads_are_the_measured_ones(text_explorer):
    model, ex = text_explorer

    tokens = model.tokenizer("attend to this")
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    first = first_token_score(cache)  # [N, H], queries 1..T-1
    view = model_view(ex)
    assert view.sinks == [(l, h) for l in range(2) for h in range(4) if float(first[l, h]) >= SINK_THRESHOLD]
    assert f"{len(view.sinks)} of 8" in repr(view) or f"{len(view.sinks)} sink heads" in repr(view)


def test_picking_a_head_opens_it_in_the_explorer(text_explorer):
    _, ex = text_explorer
    view = model_view(ex)
    before = view.png
    view.pick(1, 2)
    assert (ex.layer, ex.head) == (1, 2) and view.png != before
    with pytest.raises(IndexError, match="head 4 is out of range"):
        view.pick(0, 4)
    ui = view.widget
    layer_slider, head_slider = ui.children[0].children
    head_slider.value = 3
    assert (ex.layer, ex.head) == (1, 3) and ui.children[-1].value == view.png


def test_new_text_and_the_toggle_redraw_the_view(text_explorer):
    _, ex = text_explorer
    view = model_view(ex, pixels=8)
    png = view.png
    ex.set_text("something else")
    assert "15 tokens" in repr(view) and view.png != png
    view.set_hidden(True)
    assert ex.hide_special
    r, c = view.cell_origin(0, 0)
    hidden = hide_keys(ex.data.attention[0, 0, 0], ex.data.special_keys())
    index = np.arange(8) * ex.data.T // 8
    expected = colormaps["viridis"](hidden[np.ix_(index, index)])[..., :3]
    np.testing.assert_allclose(view.mosaic[r : r + 8, c : c + 8], expected)
    checkbox = view.widget.children[1]
    checkbox.value = False
    assert not ex.hide_special


def test_static_fallback(text_explorer):
    _, ex = text_explorer
    view = model_view(ex)
    bundle, metadata = view._repr_mimebundle_()
    assert set(bundle) == {"image/png", "text/plain"}  # no kernel under pytest
    assert base64.b64decode(bundle["image/png"]) == view.static_png()
    assert view.STATIC_NOTE in bundle["text/plain"] and metadata["image/png"]["width"] > 0
    with pytest.raises(TypeError, match="takes a HeadExplorer"):
        widgets.ModelView(object())


def test_thumbnails_grow_to_the_explorers_width_and_stay_within_it(text_explorer):
    """The mosaic spans the explorer's width (less a margin) rather than a fixed 24 px per head."""
    from mhalab.widgets.model_view import LEFT, RIGHT

    model, _ = text_explorer
    for figsize in ((3.0, 3.0), (6.0, 3.0)):
        ex = widgets.head_explorer(model, "attend to this", figsize=figsize)
        view = model_view(ex)
        width = view.mosaic.shape[1] + LEFT + RIGHT
        assert width <= ex.css_width - 24
        assert view.pixels == 72 or width + 4 * 4 > ex.css_width - 24  # one more pixel per head would not fit


def test_the_header_fits_the_picture_however_long_the_text(text_explorer):
    """A long text is cut (with an ellipsis) so that the header's first line ends inside the picture: the
    picture's right edge beside that line stays blank."""
    import io

    from matplotlib.image import imread

    model, _ = text_explorer
    ex = widgets.head_explorer(model, "a long enough text to overflow", figsize=(3.0, 3.0))
    picture = imread(io.BytesIO(model_view(ex).png))  # [rows, columns, RGBA], white background
    first_line = picture[: picture.shape[0] // 16, -4:, :3]  # the header's first line, the last four columns
    assert first_line.min() > 0.9
