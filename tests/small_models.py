"""Small models and comparison helpers shared by several test files (helpers, not fixtures: conftest.py holds
those). Imported as ``from small_models import ...``, as labs_fixture and labs_corpus are."""

import torch
from torch import nn

from mhalab.attention import MultiHeadAttention
from mhalab.hooks import HookedRootModule
from mhalab.models import ModelConfig, Transformer
from mhalab.torch_interop import from_torch

D, H = 16, 4  # d_model and heads of the small attention modules and models below


# Small float64 models and their weights sliced by hand, shared by tests/test_circuits.py, tests/test_factored_matrix.py
# and tests/test_head_weights.py.
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


def pair(d_model=D, n_heads=H, *, bias=True, dropout=0.0, device="cpu"):
    """A torch.nn.MultiheadAttention (batch first, random biases) and ours with the same weights, both in eval mode."""
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, dropout=dropout, batch_first=True).to(device)
    if bias:  # torch zero-initialises the biases: make them non-zero so they are really compared
        with torch.no_grad():
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    ours = from_torch(theirs)
    return theirs.eval(), ours.eval()


# A bare two-layer attention model with the course's hook names, shared by tests/test_hooks.py and
# tests/test_head_interventions.py (each has its own `model` fixture building it: conftest's `model` is the task
# model; conftest's `toy` fixture is a small causal Transformer of these sizes).
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
