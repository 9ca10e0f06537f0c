"""Shared fixtures and markers for the mhalab test suite."""

import os

import pytest
import torch

from chromium import chromium_executable
from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests without CUDA and `browser` tests without Chromium, saying why.

    In CI (MHALAB_REQUIRE_BROWSER=1) a missing Chromium is an error, not a skip.
    """
    has_cuda = torch.cuda.is_available()
    has_chromium = chromium_executable() is not None
    require_browser = os.environ.get("MHALAB_REQUIRE_BROWSER") == "1"
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False"))
        if "browser" in item.keywords and not has_chromium:
            if require_browser:
                item.fail_missing_browser = True
            else:
                item.add_marker(pytest.mark.skip(reason="needs Chromium: apt-get install -y chromium chromium-driver"))


@pytest.fixture(autouse=True)
def _fail_without_browser(request):
    if getattr(request.node, "fail_missing_browser", False):
        pytest.fail("MHALAB_REQUIRE_BROWSER=1 but chromium is not installed: the browser test must run here")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# A small untrained model on a two-relation task, shared by tests/test_scores.py and tests/test_ablation.py.
@pytest.fixture
def task():
    return MultiRelationTask((-1, 1), vocab_size=8, seq_len=8)


@pytest.fixture
def model(task):
    torch.manual_seed(0)
    return Transformer(ModelConfig.for_task(task, d_model=16, n_heads=4, n_layers=2))


@pytest.fixture
def batch(task):
    return task.sample(6, generator=torch.Generator().manual_seed(1))


# A head explorer over a small untrained model, shared by tests/test_widgets.py and tests/test_head_grid.py.
@pytest.fixture(scope="module")
def explorer_setup():
    """``(task, model, batch, explorer)``: 2 layers x 4 heads, relations left1 and right2, 3 examples."""
    from mhalab import widgets

    task = MultiRelationTask((-1, 2), vocab_size=8, seq_len=8)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.for_task(task, d_model=16, n_heads=4, n_layers=2))
    batch = task.sample(5, generator=torch.Generator().manual_seed(3))
    explorer = widgets.head_explorer(model, batch, task, examples=3, figsize=(6, 3))
    return task, model, batch, explorer
