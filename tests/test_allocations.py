"""Tests for mhalab.allocations: the tensors a call creates, and the most bytes of them alive at once."""

import pytest
import torch
import torch.nn.functional as F

from mhalab import MultiHeadAttention
from mhalab.allocations import Footprint, NewTensor, footprint
from mhalab.dot_product_attention import attention_weights


def test_one_new_tensor_is_recorded_with_its_operator_shape_and_bytes():
    result, fp = footprint(lambda: torch.empty(10, 100))
    assert fp.tensors == (NewTensor("aten.empty", (10, 100), torch.float32, 4000),)
    assert fp.largest == fp.tensors[0]
    assert fp.peak_bytes == fp.kept_bytes == 4000
    assert result.shape == (10, 100)


def test_temporaries_count_towards_the_peak_but_not_what_is_kept():
    # ones (4000 bytes) and ones * 2 (4000) are alive together; the sum (4 bytes) is all that is kept.
    _, fp = footprint(lambda: (torch.ones(1000) * 2).sum())
    assert [t.op for t in fp.tensors] == ["aten.ones", "aten.mul", "aten.sum"]
    assert fp.peak_bytes == 8000
    assert fp.kept_bytes == 4


def test_views_and_in_place_writes_on_outside_tensors_are_not_new():
    x = torch.randn(10, 10)
    _, views = footprint(lambda: (x.t(), x[2:], x.view(100)))
    _, in_place = footprint(lambda: x.mul_(1.0))
    _, copy = footprint(lambda: x.t().contiguous())
    assert views.tensors == () and views.peak_bytes == 0
    assert in_place.tensors == () and in_place.peak_bytes == 0
    assert [t.bytes for t in copy.tensors] == [400]


def test_a_view_keeps_its_storage_alive():
    # The view outlives the tensor it was cut from, so the 4000 bytes are still held at the end.
    _, fp = footprint(lambda: torch.zeros(1000)[:10])
    assert fp.peak_bytes == fp.kept_bytes == 4000


def test_explicit_attention_materialises_the_scores_and_the_fused_kernel_does_not():
    B, H, L, dk = 1, 4, 32, 8
    q, k, v = (torch.randn(B, H, L, dk) for _ in range(3))
    score_bytes = B * H * L * L * 4
    _, explicit = footprint(lambda: attention_weights(q, k) @ v)
    _, fused = footprint(lambda: F.scaled_dot_product_attention(q, k, v))
    assert len([t for t in explicit.tensors if t.bytes == score_bytes]) >= 2   # the scores and the weights
    assert explicit.peak_bytes >= 2 * score_bytes
    assert all(t.bytes < score_bytes for t in fused.tensors)
    assert fused.kept_bytes == B * H * L * dk * 4   # only the output survives


def test_autograd_keeps_the_weights_of_the_explicit_path_for_the_backward_pass():
    layer = MultiHeadAttention(32, 4)
    x = torch.randn(1, 64, 32, requires_grad=True)
    weight_bytes = 4 * 64 * 64 * 4
    _, training = footprint(lambda: layer(x, need_weights=True)[0])   # the weights are not returned...
    with torch.no_grad():
        _, inference = footprint(lambda: layer(x, need_weights=True)[0])
    assert training.kept_bytes >= inference.kept_bytes + weight_bytes    # ...but saved for backward


def test_peak_agrees_with_the_cpu_allocator():
    # The allocator (seen through the profiler) can only hold more: scratch inside kernels, scalars.
    profiler = pytest.importorskip("torch.profiler")
    layer = MultiHeadAttention(64, 8).eval()
    x = torch.randn(1, 48, 64)
    with torch.no_grad():
        _, fp = footprint(lambda: layer(x, need_weights=True, average_attn_weights=False))
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            out = layer(x, need_weights=True, average_attn_weights=False)
    del out
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        pytest.skip("this torch's profiler does not expose its allocation events")
    events = [e for e in results.events() if e.name() == "[memory]"]
    when = (lambda e: e.start_ns()) if hasattr(events[0], "start_ns") else (lambda e: e.start_us())
    held = peak = 0
    for e in sorted(events, key=when):
        held += e.nbytes()
        peak = max(peak, held)
    assert fp.peak_bytes <= peak <= fp.peak_bytes + 1024


def test_largest_and_with_shape():
    _, fp = footprint(lambda: (torch.zeros(3, 4), torch.zeros(5, 6), torch.zeros(3, 4)))
    assert fp.largest.shape == (5, 6)
    assert [t.shape for t in fp.with_shape((3, 4))] == [(3, 4), (3, 4)]
    assert Footprint((), 0, 0).largest is None
    assert "3 new tensors" in repr(fp)


def test_not_a_function_is_refused():
    with pytest.raises(TypeError, match="function of no arguments"):
        footprint(torch.zeros(3))
