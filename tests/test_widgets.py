"""mhalab.widgets: the head explorer answers from precomputed arrays, with or without a frontend."""

import numpy as np
import pytest
import torch

from mhalab import widgets
from mhalab.head_data import hide_keys
from mhalab.head_roles import GENERIC_SCORES, stack_attention


def test_explorer_precomputes_everything(explorer_setup):
    task, model, batch, ex = explorer_setup
    assert ex.data.attention.shape == (2, 3, 4, 8, 8)  # [layer, example, head, query, key]
    _, cache = model.eval().run_with_cache(batch.inputs, names_filter=lambda name: name.endswith("hook_pattern"))
    stacked = stack_attention(cache)
    np.testing.assert_allclose(ex.data.attention, stacked[:, :3].numpy())
    assert set(ex.data.scores) == {"left1", "right2", *GENERIC_SCORES}
    assert ex.data.ablation is not None and ex.data.ablation.ablated["accuracy"].shape == (2, 4)
    assert ex.data.labels[0] == task.token_labels(batch.inputs[0])
    assert ex.png.startswith(b"\x89PNG")


def test_update_changes_the_picture(explorer_setup):
    _, _, _, ex = explorer_setup
    ex.update(layer=0, head=0, example=0, highlight="none")
    before_png, before_map = ex.png, np.array(ex.image.get_array())
    ex.update(layer=1, head=2)
    assert ex.png != before_png
    np.testing.assert_array_equal(ex.image.get_array(), ex.data.attention[1, 0, 2])
    assert not np.array_equal(ex.image.get_array(), before_map)
    ex.update(example=2)  # new tick labels
    assert [t.get_text() for t in ex.ax_map.get_xticklabels()] == ex.data.labels[2]
    assert "layer 1, head 2, example 2" in ex.map_title.get_text()


def test_highlight_marks_where_the_relation_points(explorer_setup):
    _, _, batch, ex = explorer_setup
    ex.update(example=1, highlight="right2")
    keys, queries = ex.markers.get_offsets().T
    src = batch.sources["right2"][1]
    assert queries.tolist() == [q for q in range(8) if src[q] >= 0]
    assert keys.tolist() == [int(src[q]) for q in queries.astype(int)]
    ex.update(highlight="previous-token")
    assert ex.markers.get_offsets().tolist() == [[q - 1, q] for q in range(1, 8)]
    ex.update(highlight="none")
    assert len(ex.markers.get_offsets()) == 0


def test_bad_controls_get_clear_errors(explorer_setup):
    _, _, _, ex = explorer_setup
    with pytest.raises(IndexError, match=r"layer 2 is out of range: choose 0..1"):
        ex.update(layer=2)
    with pytest.raises(IndexError, match=r"example 3 is out of range: choose 0..2"):
        ex.update(example=3)
    with pytest.raises(TypeError, match="head must be an int"):
        ex.update(head="1")
    with pytest.raises(ValueError, match="highlight must be one of"):
        ex.update(highlight="left7")


def test_sliders_drive_the_same_update(explorer_setup):
    _, _, _, ex = explorer_setup
    ui = ex.widget  # builds without a frontend
    assert type(ui).__name__ == "VBox"
    (layer_slider, head_slider, _), image = ui.children[0].children, ui.children[-1]
    ex.update(layer=0, head=0)
    shown, pictures = image.value, []
    image.observe(lambda change: pictures.append(change["new"]), names="value")
    head_slider.value = 3
    assert ex.head == 3 and len(pictures) == 1  # one new picture per move
    assert image.value == ex.png and ex.png != shown
    ex.update(layer=1)  # from Python: the sliders follow without a second redraw
    assert layer_slider.value == 1 and len(pictures) == 2


def _png_size(data: bytes) -> tuple[int, int]:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).size


def test_static_fallback_without_a_frontend(explorer_setup):
    import base64

    _, _, _, ex = explorer_setup
    assert not widgets.widgets_available()  # no kernel under pytest
    bundle, metadata = ex._repr_mimebundle_()
    assert set(bundle) == {"image/png", "text/plain"}  # no widget view without a kernel to drive it
    still = base64.b64decode(bundle["image/png"])
    assert still.startswith(b"\x89PNG") and still == ex.static_png()
    width, height = _png_size(still)
    # the current picture, a band for the note below
    assert width == _png_size(ex.png)[0] and height > _png_size(ex.png)[1]
    # Drawn at 1.5x the CSS pixels it is shown at (96 px per inch): sharp on HiDPI, not stretched.
    inches = ex.figure.get_size_inches()[0]
    assert metadata["image/png"]["width"] == round(inches * 96) and width == round(1.5 * 96 * inches)
    assert ex.STATIC_NOTE in bundle["text/plain"] and "HeadExplorer" in bundle["text/plain"]


def test_one_output_holds_the_widget_and_the_still(explorer_setup, monkeypatch):
    """Where a kernel runs, the bundle also carries the widget view: a frontend that draws widgets shows
    the sliders, a saved notebook shown without widgets (GitHub, nbviewer, the website) shows the still."""
    _, _, _, ex = explorer_setup
    monkeypatch.setattr(widgets.display, "widgets_available", lambda: True)  # where the explorers ask
    bundle, _ = ex._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == ex.widget.model_id and view["version_major"] == 2
    assert "image/png" in bundle and ex.STATIC_NOTE in bundle["text/plain"]
    ex.update(layer=1, head=1)
    moved = ex._repr_mimebundle_()[0]["image/png"]
    ex.update(layer=0, head=0)
    assert ex._repr_mimebundle_()[0]["image/png"] != moved  # the still is the current picture


def test_reuses_a_precomputed_ablation_and_skips_it_when_asked(explorer_setup):
    task, model, batch, ex = explorer_setup
    again = widgets.HeadExplorer(model, batch, task, ablation=ex.data.ablation)
    assert again.data.ablation is ex.data.ablation and "head off" in again.data.ablation_text(0, 0)
    bare = widgets.HeadExplorer(model, batch.inputs, ablation=False)
    assert bare.data.relations == [] and bare.data.ablation is None and bare.data.ablation_text(0, 0) == ""
    assert "on the first token" in bare.footer_text(0, 0) and "task=" not in bare.footer_text(0, 0)
    assert bare.data.labels[0] == [str(int(t)) for t in batch.inputs[0]]


# ------------------------------------------------------------------------------------ text in, maps out
def test_an_explorer_on_text_reruns_the_model_on_new_text(text_explorer):
    model, ex = text_explorer
    assert (ex.data.T, ex.data.n_heads) == (len("attend to this") + 1, 4)
    assert ex.data.labels[0][:3] == ["<|endoftext|>", "a", "t"]
    ex.update(layer=1, head=3)
    before = ex.png
    ex.set_text("a much longer sentence.")
    assert ex.data.T == len("a much longer sentence.") + 1 and (ex.layer, ex.head) == (1, 3)
    tokens = model.tokenizer("a much longer sentence.")
    stacked = stack_attention(model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))[1])
    np.testing.assert_allclose(ex.data.attention[:, 0], stacked[:, 0].numpy())
    assert ex.png != before and "layer 1, head 3" in ex.map_title.get_text()


def test_text_limits_are_stated_and_leave_the_explorer_as_it_was(text_explorer):
    _, ex = text_explorer
    T, png = ex.data.T, ex.png
    with pytest.raises(ValueError, match="empty"):
        ex.set_text("   ")
    with pytest.raises(ValueError, match=rf"40 tokens; the explorer takes at most {widgets.MAX_TOKENS}"):
        ex.set_text("x" * 39)
    assert (ex.data.T, ex.png) == (T, png)
    ex.set_text("x" * (widgets.MAX_TOKENS - 1))  # exactly the cap
    assert ex.data.T == widgets.MAX_TOKENS
    with pytest.raises(TypeError, match="takes text"):
        widgets.HeadExplorer(text_explorer[0], torch.tensor([[0, 1, 2]]), ablation=False).set_text("hi")


def test_the_text_box_redraws_on_enter_and_says_what_is_wrong(text_explorer):
    _, ex = text_explorer
    ui = ex.widget
    box = ui.children[0].children[0]
    message, image = ui.children[1], ui.children[-1]
    assert type(box).__name__ == "Text" and box.continuous_update is False  # a new value on Enter, not per key
    shown = image.value
    box.value = "new words here"
    assert ex.data.T == len("new words here") + 1 and image.value == ex.png != shown
    assert f"{ex.data.T} tokens" in message.value
    box.value = ""
    assert "empty" in message.value and image.value == ex.png and ex.data.T == len("new words here") + 1
    box.value = "y" * 50
    assert "at most 32" in message.value


def test_hide_keys_renormalises_what_is_left():
    weights = np.array([[1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])
    shown = hide_keys(weights, [0])
    np.testing.assert_allclose(shown, [[0.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.25, 0.75]])  # row 0 had only key 0


def test_the_toggle_hides_the_first_token_and_special_tokens(text_explorer):
    _, ex = text_explorer
    ex.set_text("ab")
    assert ex.data.special_keys() == [0]
    ex.update(layer=0, head=1, hide_special=True)
    shown = np.array(ex.image.get_array())
    np.testing.assert_allclose(shown, hide_keys(ex.data.attention[0, 0, 1], [0]))
    assert (shown[:, 0] == 0).all() and np.allclose(shown[1:].sum(-1), 1.0)
    assert "hidden" in ex.map_title.get_text()
    ex.update(hide_special=False)
    np.testing.assert_allclose(ex.image.get_array(), ex.data.attention[0, 0, 1])


def test_the_line_under_the_map_names_the_heads_sharing_keys_and_values(text_explorer):
    _, ex = text_explorer
    assert ex.data.kv_group(3) == [2, 3] and ex.data.kv_group(0) == [0, 1]
    assert "K/V head 1 of 2, shared with heads 2" in ex.footer_text(0, 3)
    first = float(ex.data.scores["first-token"][0, 3])
    assert f"{first:.0%} of its attention on the first token" in ex.footer_text(0, 3)


@pytest.mark.parametrize("n", [8, 20, 32])
def test_key_and_query_labels_never_overlap(text_explorer, n):
    _, ex = text_explorer
    ex.set_text(("abcdefgh" * 4)[: n - 1])
    renderer = ex.figure.canvas.get_renderer()
    for labels in (ex.ax_map.get_xticklabels(), ex.ax_map.get_yticklabels()):
        boxes = [t.get_window_extent(renderer) for t in labels if t.get_text()]
        assert len(boxes) >= min(n, 8)
        assert not any(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1
                       for i, a in enumerate(boxes) for b in boxes[i + 1:])
# ------------------------------------------------------------------ formation explorer
@pytest.fixture(scope="module")
def formation_setup():
    import torch

    from mhalab.formation import FormationRecorder
    from mhalab.models import ModelConfig, Transformer
    from mhalab.tasks import RepeatedSegments

    task = RepeatedSegments(vocab_size=12, seq_len=24, n_segments=2, segment_lengths=(3, 6))
    torch.manual_seed(0)
    model = Transformer(ModelConfig.for_task(task, d_model=16, n_heads=2, n_layers=2, attn_only=True))
    recorder = FormationRecorder(task, batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = task.sample(8, generator=torch.Generator().manual_seed(1))
    for step in (0, 5, 10):  # three recorded steps of a model that changes between them
        recorder(step, model)
        for _ in range(5):
            optimizer.zero_grad()
            task.loss(model(batch.inputs), batch).backward()
            optimizer.step()
    return task, recorder, widgets.formation_explorer(recorder, task)


def test_formation_explorer_shows_the_recorded_step_and_head(formation_setup):
    task, recorder, ex = formation_setup
    assert ex.step == 10 and (ex.layer, ex.head) == (0, 0)  # starts at the last recorded step
    pictures = {}
    for step in recorder.steps:
        for layer, head in ((0, 0), (1, 1)):
            ex.update(layer=layer, head=head, step=step)
            k = recorder.steps.index(step)
            np.testing.assert_array_equal(ex.image.get_array(), recorder.patterns[k, layer, head].numpy())
            assert f"induction {float(recorder.score('induction')[k, layer, head]):.2f}" in ex.curve_title.get_text()
            assert ex.map_title.get_text() == f"layer {layer} head {head} at step {step}"
            pictures[step, layer, head] = ex.png
    assert len(set(pictures.values())) == len(pictures)  # every step and head draws its own picture
    with pytest.raises(ValueError, match="step 7 was not recorded; the recorded steps are 0, 5 ... 10"):
        ex.update(step=7)
    with pytest.raises(IndexError, match="head 2 is out of range"):
        ex.update(head=2)


def test_formation_explorer_slider_and_still(formation_setup, monkeypatch):
    import base64

    _, recorder, ex = formation_setup
    ex.update(layer=0, head=0, step=10)
    controls = ex.widget.children[0].children
    step_slider = controls[0]
    assert list(step_slider.options) == recorder.steps and step_slider.value == 10
    before = ex.png
    step_slider.value = 0  # what moving the slider does
    assert ex.step == 0 and ex.png != before and ex._image_widget.value == ex.png
    bundle, _ = ex._repr_mimebundle_()
    assert set(bundle) == {"image/png", "text/plain"} and ex.STATIC_NOTE in bundle["text/plain"]
    assert base64.b64decode(bundle["image/png"]) == ex.static_png()
    monkeypatch.setattr(widgets.display, "widgets_available", lambda: True)  # where the explorers ask
    live = widgets.FormationExplorer._repr_mimebundle_(ex)[0]
    assert live["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.widget.model_id


def test_still_note_wraps_to_the_picture_width():
    import io

    from PIL import Image

    from mhalab.widgets.display import still_png

    buffer = io.BytesIO()
    Image.new("RGB", (150, 40), "white").save(buffer, format="png")
    note = "A still of the model view: run this notebook (Jupyter or Colab) to pick heads."
    one_line = _png_size(still_png(buffer.getvalue(), 1.0, "short"))
    wrapped = _png_size(still_png(buffer.getvalue(), 1.0, note))
    assert wrapped[0] == one_line[0] == 150     # the width stays the picture's
    assert wrapped[1] >= one_line[1] + 2 * 16   # a note wider than the picture takes more lines, not cut off
